"""Strict schema checks for the Kubernetes manifests kit writes (issue 33, acceptance 1).

    problems(doc) -> list of strings, empty when the object is valid
    problems_in_stream(text) -> the same for every document of a YAML stream

Each string reads "Kind/name: json.path: what is wrong". Which schema judges an object depends on its
apiVersion and kind:

- core objects (v1, batch/v1, ...): kubernetes-validate's strict schemas of K8S_VERSION (every object
  closed: an unknown field is an error). Its API stops at the first error, so one problem per object.
- MPIJob (kubeflow.org/v2beta1), PyTorchJob and TFJob (kubeflow.org/v1), JobSet (jobset.x-k8s.io/v1alpha2):
  the openAPIV3Schema of the operator's own CRD, vendored under data/k8s (SOURCES.md), made strict: what the
  API server would silently prune is an error here. Every problem is listed. The CRDs' CEL rules
  (x-kubernetes-validations) are not evaluated. The object's metadata and each embedded PodTemplateSpec /
  JobTemplateSpec are also checked by kubernetes-validate, so a field the pinned Kubernetes does not know is
  caught even where the CRD's copy of the pod schema is older. Where the schema passes, the rules the
  operators apply on top (OPERATOR_RULES: the PyTorchJob container named pytorch, one MPIJob launcher...)
  are checked too, each reported with "(operator rule)".
- TrainJob (trainer.kubeflow.org/v1alpha1): the kubeflow-trainer-api pydantic models; the models ignore
  unknown keys, so the model's own output is compared with the input and any key it dropped is reported.
"""
from __future__ import annotations

import functools
import gzip
import importlib
import json
import re
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pydantic
import yaml
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

# The newest Kubernetes whose schemas kubernetes-validate (pinned in pyproject's test extra) ships.
K8S_VERSION = "1.37.0"

DATA = Path(__file__).parent / "data" / "k8s"

# apiVersion, kind -> vendored CRD schema (data/k8s/NAME.schema.json.gz)
CRD_SCHEMAS = {
    ("kubeflow.org/v2beta1", "MPIJob"): "mpijob-v2beta1",
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjob-v1",
    ("kubeflow.org/v1", "TFJob"): "tfjob-v1",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-v1alpha2",
}
TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")

# Where each CRD kind embeds Kubernetes templates: (path pattern, template kind). "*" is every key of a map,
# [] every item of a list.
EMBEDDED = {
    "MPIJob": [(("spec", "mpiReplicaSpecs", "*", "template"), "PodTemplateSpec")],
    "PyTorchJob": [(("spec", "pytorchReplicaSpecs", "*", "template"), "PodTemplateSpec")],
    "TFJob": [(("spec", "tfReplicaSpecs", "*", "template"), "PodTemplateSpec")],
    "JobSet": [(("spec", "replicatedJobs", "[]", "template"), "JobTemplateSpec")],
}

Path_ = tuple  # a JSON path: keys and list indices


def problems_in_stream(text: str) -> list[str]:
    found = []
    for index, doc in enumerate(yaml.safe_load_all(text)):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            found.append(f"document {index}: not a mapping but {type(doc).__name__}")
            continue
        found += problems(doc)
    return found


def problems(doc: dict) -> list[str]:
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    label = f"{kind}/{(doc.get('metadata') or {}).get('name', '?')}"
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [f"{label}: apiVersion and kind: both required, as strings"]
    found = _named(doc)
    if (api_version, kind) in CRD_SCHEMAS:
        found += _crd_problems(doc, CRD_SCHEMAS[api_version, kind])
    elif (api_version, kind) == TRAINJOB:
        found += _trainjob_problems(doc)
    else:
        core = _core_problems(doc)
        if core is None:
            return [f"{label}: no schema for {api_version}/{kind}"]
        found += core
    return [f"{label}: {where}: {what}" for where, what in found]


def _named(doc: dict) -> list[tuple[str, str]]:
    # A manifest for kubectl apply needs a name; the schemas leave metadata.name optional.
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict) or not (metadata.get("name") or metadata.get("generateName")):
        return [("metadata.name", "required (a manifest to apply needs a name)")]
    return []


def json_path(path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "(top)"


# -- core objects: kubernetes-validate ---------------------------------------------------------------------

def _core_problems(doc: dict) -> list[tuple[str, str]] | None:
    """None where kubernetes-validate has no schema for the kind (a CRD kit has not vendored, a typo)."""
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return None
    except kubernetes_validate.ValidationError as error:
        return _schema_error(error, ())
    return []


def _k8s_as(wrapper: dict, strip: int, prefix: Path_) -> list[tuple[str, str]]:
    """kubernetes-validate on an embedded part, wrapped in a core object; the error's path is mapped back
    (strip the wrapper's first `strip` keys, put the part's own path in front)."""
    try:
        kubernetes_validate.validate(wrapper, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return _schema_error(error, prefix, strip)
    return []


def _schema_error(error: jsonschema.ValidationError, prefix: Path_, strip: int = 0) -> list[tuple[str, str]]:
    """One problem per unknown key (jsonschema names them all in one message), else jsonschema's message."""
    path = prefix + tuple(error.absolute_path)[strip:]
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = error.schema.get("properties", {})
        return [(json_path(path + (key,)), "unknown field") for key in error.instance if key not in known]
    return [(json_path(path), error.message)]


# -- CRD kinds: the operator's own openAPIV3Schema, strict -------------------------------------------------

@functools.cache
def crd_validator(name: str) -> jsonschema.Draft7Validator:
    with gzip.open(DATA / f"{name}.schema.json.gz", "rt") as f:
        schema = strict(json.load(f))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def strict(schema: Any) -> Any:
    """An OpenAPI v3 structural schema as JSON Schema: closed objects, int-or-string and nullable honoured."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "oneOf", "allOf"):
            out[key] = strict(value)
        elif key == "description" or key.startswith("x-kubernetes-") and key != "x-kubernetes-int-or-string":
            continue
        else:
            out[key] = value  # default, enum, pattern...: values, not schemas
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in schema and "additionalProperties" not in schema and not preserve:
        out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string") is True:
        out.pop("x-kubernetes-int-or-string")
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if schema.get("nullable") is True:
        out.pop("nullable")
        if "type" in out:
            out["type"] = (out["type"] if isinstance(out["type"], list) else [out["type"]]) + ["null"]
        if "enum" in out:
            out["enum"] = out["enum"] + [None]
    else:
        out.pop("nullable", None)
    return out


def _crd_problems(doc: dict, name: str) -> list[tuple[str, str]]:
    found = []
    for error in crd_validator(name).iter_errors(doc):
        found += _schema_error(error, ())
    if not found and doc["kind"] in OPERATOR_RULES:
        found += OPERATOR_RULES[doc["kind"]](doc)
    if isinstance(doc.get("metadata"), dict):
        found += _k8s_as({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}, 0, ())
    for pattern, template_kind in EMBEDDED[doc["kind"]]:
        for path, template in _at(doc, pattern):
            if not isinstance(template, dict):
                continue  # the CRD schema has reported it
            if template_kind == "PodTemplateSpec":
                found += _k8s_as({"apiVersion": "v1", "kind": "PodTemplate", "template": template}, 1, path)
            else:
                found += _k8s_as({"apiVersion": "batch/v1", "kind": "Job", **template}, 0, path)
    return sorted(set(found))


def _at(node: Any, pattern: Path_, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if not pattern:
        yield path, node
        return
    step, rest = pattern[0], pattern[1:]
    if step == "*" and isinstance(node, dict):
        for key, value in node.items():
            yield from _at(value, rest, path + (key,))
    elif step == "[]" and isinstance(node, list):
        for index, value in enumerate(node):
            yield from _at(value, rest, path + (index,))
    elif isinstance(node, dict) and step in node:
        yield from _at(node[step], rest, path + (step,))


# -- TrainJob: the kubeflow-trainer-api models -------------------------------------------------------------

def _trainjob_problems(doc: dict) -> list[tuple[str, str]]:
    found = _model_errors(TrainerV1alpha1TrainJob, doc)
    if found:
        return found
    try:
        parsed = TrainerV1alpha1TrainJob.from_dict(doc)
    except (pydantic.ValidationError, ValueError) as error:
        return [("(top)", f"the model's from_dict refused it: {error}")]
    return _dropped(doc, parsed.to_dict(), ())


def _model_errors(model: type[pydantic.BaseModel], doc: dict) -> list[tuple[str, str]]:
    """pydantic's errors with their full path. The generated oneOf wrappers (Quantity, IntOrString) cannot be
    validated from a plain value by pydantic itself; for them the wrapper's own from_dict decides."""
    try:
        model.model_validate(doc)
    except pydantic.ValidationError as error:
        found = []
        for entry in error.errors():
            wrapper = entry["ctx"]["class_name"] if entry["type"] == "model_type" else ""
            if wrapper in _oneof_wrappers():
                if not _wrapper_accepts(wrapper, entry["input"]):
                    found.append((json_path(entry["loc"]), f"{entry['input']!r} is not a {_oneof_wrappers()[wrapper]}"))
                continue
            found.append((json_path(entry["loc"]), entry["msg"]))
        return found
    return []


def _wrapper_accepts(class_name: str, value: Any) -> bool:
    models = importlib.import_module("kubeflow_trainer_api.models")
    try:
        getattr(models, class_name).from_dict(value)
    except (pydantic.ValidationError, ValueError):
        return False
    return True


def _oneof_wrappers() -> dict[str, str]:
    # The generated oneOf models, which take a plain value through their own from_dict: what they stand for.
    return {"IoK8sApimachineryPkgApiResourceQuantity": "quantity (a string such as 8Gi, or a number)",
            "IoK8sApimachineryPkgUtilIntstrIntOrString": "int-or-string"}


def _dropped(given: Any, kept: Any, path: Path_) -> list[tuple[str, str]]:
    """Where the model's output differs from its input: a key it dropped is one it does not know."""
    if isinstance(given, dict) and isinstance(kept, dict):
        found = []
        for key, value in given.items():
            if key not in kept:
                found.append((json_path(path + (key,)), "unknown field" if value is not None else "null value"))
            else:
                found += _dropped(value, kept[key], path + (key,))
        return found
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [p for index, pair in enumerate(zip(given, kept)) for p in _dropped(*pair, path + (index,))]
    if given != kept or _kind(given) != _kind(kept):
        return [(json_path(path), f"the model reads {given!r} as {kept!r}")]
    return []


def _kind(value: Any) -> type:
    # The Quantity model stores an int as a float: 1 and 1.0 are the same quantity, "1" and 1 or True are not.
    return float if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value)


# -- what the operators reject beyond their CRD schemas ----------------------------------------------------
# The API server accepts these objects; the operator's admission webhook (training-operator) or its controller
# (mpi-operator) then refuses them. Each message ends in "(operator rule)". Sources: training-operator v1.9.0
# pkg/webhooks/{pytorch,tensorflow}/*_webhook.go; mpi-operator v0.8.0 pkg/apis/kubeflow/validation/validation.go
# after v2beta1/default.go.

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RULE = " (operator rule)"


def _dns1035(name: str) -> bool:
    return len(name) <= 63 and DNS1035.fullmatch(name) is not None


def _name_rule(doc: dict) -> list[tuple[str, str]]:
    name = doc["metadata"].get("name")  # absent: generateName, which the webhook checks on the final name
    return [] if name is None or _dns1035(name) else [("metadata.name", "not a DNS-1035 label" + RULE)]


def _replicas(doc: dict, key: str, default_container: str | None) -> list[tuple[str, str]]:
    found = []
    for role, spec in doc["spec"][key].items():
        where = ("spec", key, role, "template", "spec", "containers")
        containers = (((spec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            found.append((json_path(where), "at least one container required" + RULE))
        for index, container in enumerate(containers):
            if not container.get("image"):
                found.append((json_path(where + (index, "image")), "required" + RULE))
        if default_container and containers and all(c.get("name") != default_container for c in containers):
            found.append((json_path(where), f"needs a container named {default_container}" + RULE))
    return found


def _pytorchjob_rules(doc: dict) -> list[tuple[str, str]]:
    found = _name_rule(doc)
    found += _replicas(doc, "pytorchReplicaSpecs", "pytorch")
    for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
        replicas = spec.get("replicas")
        if role not in ("Master", "Worker"):
            found.append((json_path(("spec", "pytorchReplicaSpecs", role)), "role not Master or Worker" + RULE))
        elif role == "Master" and replicas != 1:
            found.append(("spec.pytorchReplicaSpecs.Master.replicas", "must be 1" + RULE))
        elif role == "Worker" and replicas is not None and replicas < 1:
            found.append(("spec.pytorchReplicaSpecs.Worker.replicas", "must be at least 1" + RULE))
    if "nProcPerNode" in doc["spec"].get("elasticPolicy", {}) and "nprocPerNode" in doc["spec"]:
        found.append(("spec.elasticPolicy.nProcPerNode", "must not be used with spec.nprocPerNode" + RULE))
    return found


def _tfjob_rules(doc: dict) -> list[tuple[str, str]]:
    found = _name_rule(doc)
    found += _replicas(doc, "tfReplicaSpecs", "tensorflow")
    if len({"Chief", "Master"} & set(doc["spec"]["tfReplicaSpecs"])) > 1:
        found.append(("spec.tfReplicaSpecs", "not more than one Chief or Master" + RULE))
    return found


def _mpijob_rules(doc: dict) -> list[tuple[str, str]]:
    spec, path = doc["spec"], ("spec", "mpiReplicaSpecs")
    roles = spec["mpiReplicaSpecs"]
    found = _replicas(doc, "mpiReplicaSpecs", None)
    workers = (roles.get("Worker") or {}).get("replicas") or 1
    if "name" in doc["metadata"] and not _dns1035(f"{doc['metadata']['name']}-worker-{max(workers, 1) - 1}"):
        found.append(("metadata.name", "the last worker's host name would not be a DNS-1035 label" + RULE))
    if "Launcher" not in roles:
        found.append((json_path(path + ("Launcher",)), "required" + RULE))
    for role, role_spec in roles.items():
        replicas = (role_spec or {}).get("replicas", 1 if role == "Launcher" else 0)
        if role == "Launcher" and replicas != 1:
            found.append((json_path(path + (role, "replicas")), "must be 1" + RULE))
        elif role == "Worker" and replicas < 1:
            found.append((json_path(path + (role, "replicas")), "required, at least 1" + RULE))
        elif role not in ("Launcher", "Worker"):
            found.append((json_path(path + (role,)), "role not Launcher or Worker" + RULE))
        restart = (role_spec or {}).get("restartPolicy", "OnFailure" if role == "Launcher" else "Never")
        if restart not in ("Never", "OnFailure"):
            found.append((json_path(path + (role, "restartPolicy")), "must be Never or OnFailure" + RULE))
    if spec.get("runPolicy", {}).get("cleanPodPolicy", "None") not in ("None", "Running", "All"):
        found.append(("spec.runPolicy.cleanPodPolicy", "must be None, Running or All" + RULE))
    # The CRD's enum marker for it is malformed (+kubebuilder:validation:Enum:...), so the API server takes any
    # string; the operator knows these two.
    if spec.get("launcherCreationPolicy", "AtStartup") not in ("AtStartup", "WaitForWorkersReady"):
        found.append(("spec.launcherCreationPolicy", "must be AtStartup or WaitForWorkersReady" + RULE))
    return found


OPERATOR_RULES = {"PyTorchJob": _pytorchjob_rules, "TFJob": _tfjob_rules, "MPIJob": _mpijob_rules}
