"""The schema harness of issue 33 can fail: a valid object of each kind passes, and an unknown field, a wrong
type and a missing required field are each reported with the object and the path."""
import copy

import kubernetes_validate
import pytest
import yaml

import k8sschemas
from k8sschemas import problems, problems_in_stream

IMAGE = "registry.example.org/kit/job:3f2a9c1"

VALID = {
    "configmap": """
apiVersion: v1
kind: ConfigMap
metadata: {name: job-files, labels: {app.kubernetes.io/managed-by: kit}}
data: {train.py: "print('hi')\\n"}
""",
    "secret": """
apiVersion: v1
kind: Secret
metadata: {name: job-env}
type: Opaque
stringData: {WANDB_API_KEY: not-inlined-anywhere-else}
""",
    "service": """
apiVersion: v1
kind: Service
metadata: {name: job}
spec:
  clusterIP: None
  selector: {job-name: job}
  ports: [{name: c10d, port: 29500, targetPort: 29500}, {name: named, port: 2222, targetPort: ssh}]
""",
    "pvc": """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: workspace}
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 10Gi}}
""",
    "job": f"""
apiVersion: batch/v1
kind: Job
metadata: {{name: job}}
spec:
  completionMode: Indexed
  completions: 2
  parallelism: 2
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      subdomain: job
      containers:
      - name: rank
        image: {IMAGE}
        command: [python, train.py]
        env:
        - name: RANK
          valueFrom: {{fieldRef: {{fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}}
        envFrom: [{{secretRef: {{name: job-env}}}}]
        resources: {{limits: {{nvidia.com/gpu: 1, memory: 8Gi}}}}
        volumeMounts: [{{name: shm, mountPath: /dev/shm}}]
      volumes: [{{name: shm, emptyDir: {{medium: Memory, sizeLimit: 8Gi}}}}]
""",
    "mpijob": f"""
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {{name: hvd}}
spec:
  slotsPerWorker: 1
  launcherCreationPolicy: WaitForWorkersReady
  sshAuthMountPath: /home/kit/.ssh
  mpiImplementation: OpenMPI
  runPolicy: {{cleanPodPolicy: Running}}
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: launcher
            image: {IMAGE}
            command: [horovodrun, -np, "2", --hostfile, /etc/mpi/hostfile, python, train.py]
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - name: worker
            image: {IMAGE}
            resources: {{limits: {{nvidia.com/gpu: 1}}}}
            volumeMounts: [{{name: shm, mountPath: /dev/shm}}]
          volumes: [{{name: shm, emptyDir: {{medium: Memory}}}}]
""",
    "pytorchjob": f"""
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: ddp}}
spec:
  nprocPerNode: "1"
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: pytorch
            image: {IMAGE}
            command: [torchrun, train.py]
            resources: {{limits: {{nvidia.com/gpu: 1}}}}
    Worker:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: pytorch
            image: {IMAGE}
            command: [torchrun, train.py]
            resources: {{limits: {{nvidia.com/gpu: 1}}}}
""",
    "tfjob": f"""
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {{name: tf}}
spec:
  tfReplicaSpecs:
    Worker:
      replicas: 2
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: tensorflow
            image: {IMAGE}
            command: [python, train.py]
""",
    "trainjob": f"""
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: tj}}
spec:
  runtimeRef: {{name: torch-distributed}}
  trainer:
    image: {IMAGE}
    command: [torchrun, train.py]
    numNodes: 2
    resourcesPerNode: {{limits: {{nvidia.com/gpu: 1, memory: 8Gi}}}}
""",
    "jobset": f"""
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {{name: js}}
spec:
  network: {{enableDNSHostnames: true}}
  successPolicy: {{operator: All}}
  replicatedJobs:
  - name: ranks
    replicas: 1
    template:
      spec:
        completionMode: Indexed
        completions: 2
        parallelism: 2
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: rank
              image: {IMAGE}
              command: [python, train.py]
              resources: {{limits: {{nvidia.com/gpu: 1}}}}
""",
}


def doc(name):
    return yaml.safe_load(VALID[name])


def at(node, path):
    for step in path[:-1]:
        node = node[step]
    return node, path[-1]


def put(path, value):
    def change(d):
        node, last = at(d, path)
        node[last] = value
    return change


def drop(path):
    def change(d):
        node, last = at(d, path)
        del node[last]
    return change


def rename(path, new):
    def change(d):
        node, last = at(d, path)
        node[new] = node.pop(last)
    return change


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_valid_object_of_each_kind_passes(name):
    assert problems(doc(name)) == []


MPI_WORKER = ("spec", "mpiReplicaSpecs", "Worker")
PT_MASTER = ("spec", "pytorchReplicaSpecs", "Master")
TF_WORKER = ("spec", "tfReplicaSpecs", "Worker")
JS_JOB = ("spec", "replicatedJobs", 0)
JS_POD = JS_JOB + ("template", "spec", "template", "spec")
JOB_POD = ("spec", "template", "spec")

# (object, change, the problem expected: "Kind/name: path: message" begins with it)
BROKEN = [
    # unknown fields
    ("configmap", put(("datas",), {}), "ConfigMap/job-files: datas: unknown field"),
    ("secret", put(("stringdata",), {}), "Secret/job-env: stringdata: unknown field"),
    ("service", put(("spec", "ports", 0, "targetport"), 1), "Service/job: spec.ports[0].targetport: unknown field"),
    ("job", put(JOB_POD + ("containers", 0, "imagee"), "x"),
     "Job/job: spec.template.spec.containers[0].imagee: unknown field"),
    ("mpijob", rename(("spec", "mpiReplicaSpecs"), "replicaSpecs"), "MPIJob/hvd: spec.replicaSpecs: unknown field"),
    ("mpijob", put(MPI_WORKER + ("template", "spec", "containers", 0, "gpus"), 1),
     "MPIJob/hvd: spec.mpiReplicaSpecs.Worker.template.spec.containers[0].gpus: unknown field"),
    ("mpijob", put(("metadata", "nmae"), "x"), "MPIJob/hvd: metadata.nmae: unknown field"),
    ("pytorchjob", rename(("spec", "pytorchReplicaSpecs"), "replicaSpecs"),
     "PyTorchJob/ddp: spec.replicaSpecs: unknown field"),
    ("pytorchjob", put(PT_MASTER + ("template", "spec", "containers", 0, "env", ), [{"name": "A", "vaule": "1"}]),
     "PyTorchJob/ddp: spec.pytorchReplicaSpecs.Master.template.spec.containers[0].env[0].vaule: unknown field"),
    ("tfjob", put(TF_WORKER + ("restartpolicy",), "Never"),
     "TFJob/tf: spec.tfReplicaSpecs.Worker.restartpolicy: unknown field"),
    ("trainjob", rename(("spec", "trainer", "numNodes"), "numNode"), "TrainJob/tj: spec.trainer.numNode: unknown field"),
    ("trainjob", put(("spec", "trainer", "resourcesPerNode", "limit"), {}),
     "TrainJob/tj: spec.trainer.resourcesPerNode.limit: unknown field"),
    ("jobset", put(JS_POD + ("containers", 0, "imagee"), "x"),
     "JobSet/js: spec.replicatedJobs[0].template.spec.template.spec.containers[0].imagee: unknown field"),
    ("jobset", put(("spec", "network", "enableDnsHostnames"), True),
     "JobSet/js: spec.network.enableDnsHostnames: unknown field"),
    # wrong types
    ("configmap", put(("data", "train.py"), 1), "ConfigMap/job-files: data[\"train.py\"]: 1 is not of type 'string'"),
    ("secret", put(("immutable",), "yes"), "Secret/job-env: immutable: 'yes' is not of type 'boolean'"),
    ("service", put(("spec", "ports", 0, "port"), "two"), "Service/job: spec.ports[0].port: 'two' is not of type"),
    ("job", put(("spec", "completions"), "two"), "Job/job: spec.completions: 'two' is not of type"),
    ("mpijob", put(MPI_WORKER + ("replicas",), "two"),
     "MPIJob/hvd: spec.mpiReplicaSpecs.Worker.replicas: 'two' is not of type 'integer'"),
    ("mpijob", put(("spec", "mpiImplementation"), "OpenMPI5"), "MPIJob/hvd: spec.mpiImplementation: 'OpenMPI5' is not one of"),
    ("mpijob", put(MPI_WORKER + ("template", "spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"), "lots"),
     "MPIJob/hvd: spec.mpiReplicaSpecs.Worker.template.spec.containers[0].resources.limits[\"nvidia.com/gpu\"]: 'lots' does not match"),
    ("pytorchjob", put(PT_MASTER + ("replicas",), "two"),
     "PyTorchJob/ddp: spec.pytorchReplicaSpecs.Master.replicas: 'two' is not of type 'integer'"),
    ("pytorchjob", put(("spec", "nprocPerNode"), 2), "PyTorchJob/ddp: spec.nprocPerNode: 2 is not of type 'string'"),
    ("tfjob", put(TF_WORKER + ("replicas",), "two"),
     "TFJob/tf: spec.tfReplicaSpecs.Worker.replicas: 'two' is not of type 'integer'"),
    ("trainjob", put(("spec", "trainer", "numNodes"), "two"), "TrainJob/tj: spec.trainer.numNodes: Input should be a valid integer"),
    ("trainjob", put(("spec", "trainer", "command"), "torchrun train.py"), "TrainJob/tj: spec.trainer.command: Input should be a valid list"),
    ("jobset", put(JS_JOB + ("replicas",), "two"), "JobSet/js: spec.replicatedJobs[0].replicas: 'two' is not of type 'integer'"),
    ("jobset", put(("spec", "successPolicy", "operator"), "Each"), "JobSet/js: spec.successPolicy.operator: 'Each' is not one of"),
    # missing required fields
    ("configmap", drop(("metadata", "name")), "ConfigMap/?: metadata.name: required"),
    ("service", drop(("spec", "ports", 0, "port")), "Service/job: spec.ports[0]: 'port' is a required property"),
    ("job", drop(JOB_POD + ("containers", 0, "name")),
     "Job/job: spec.template.spec.containers[0]: 'name' is a required property"),
    ("mpijob", drop(("spec", "mpiReplicaSpecs")), "MPIJob/hvd: spec: 'mpiReplicaSpecs' is a required property"),
    ("mpijob", drop(MPI_WORKER + ("template", "spec", "containers", 0, "name")),
     "MPIJob/hvd: spec.mpiReplicaSpecs.Worker.template.spec.containers[0]: 'name' is a required property"),
    ("pytorchjob", drop(("spec", "pytorchReplicaSpecs")), "PyTorchJob/ddp: spec: 'pytorchReplicaSpecs' is a required property"),
    ("tfjob", drop(("spec", "tfReplicaSpecs")), "TFJob/tf: spec: 'tfReplicaSpecs' is a required property"),
    ("trainjob", drop(("spec", "runtimeRef")), "TrainJob/tj: spec.runtimeRef: Field required"),
    ("trainjob", drop(("spec", "runtimeRef", "name")), "TrainJob/tj: spec.runtimeRef.name: Field required"),
    ("jobset", drop(JS_JOB + ("name",)), "JobSet/js: spec.replicatedJobs[0]: 'name' is a required property"),
    ("jobset", drop(("spec", "successPolicy", "operator")), "JobSet/js: spec.successPolicy: 'operator' is a required property"),
]


@pytest.mark.parametrize("name, change, expected", BROKEN, ids=[b[2].split(":")[0] + ":" + b[2].split(":")[1] for b in BROKEN])
def test_a_broken_object_is_reported_with_its_path(name, change, expected):
    broken = doc(name)
    change(broken)
    found = problems(broken)
    assert any(p.startswith(expected) for p in found), found


# What the operators refuse although the CRD schema takes it (webhook or controller rules)
OPERATOR = [
    ("pytorchjob", put(PT_MASTER + ("template", "spec", "containers", 0, "name"), "trainer"),
     "PyTorchJob/ddp: spec.pytorchReplicaSpecs.Master.template.spec.containers: needs a container named pytorch"),
    ("pytorchjob", put(PT_MASTER + ("replicas",), 2), "PyTorchJob/ddp: spec.pytorchReplicaSpecs.Master.replicas: must be 1"),
    ("pytorchjob", rename(("spec", "pytorchReplicaSpecs", "Worker"), "Workers"),
     "PyTorchJob/ddp: spec.pytorchReplicaSpecs.Workers: role not Master or Worker"),
    ("pytorchjob", put(("metadata", "name"), "DDP_1"), "PyTorchJob/DDP_1: metadata.name: not a DNS-1035 label"),
    ("tfjob", put(TF_WORKER + ("template", "spec", "containers", 0, "name"), "tf"),
     "TFJob/tf: spec.tfReplicaSpecs.Worker.template.spec.containers: needs a container named tensorflow"),
    ("tfjob", put(TF_WORKER + ("template", "spec", "containers", 0, "image"), ""),
     "TFJob/tf: spec.tfReplicaSpecs.Worker.template.spec.containers[0].image: required"),
    ("mpijob", drop(("spec", "mpiReplicaSpecs", "Launcher")), "MPIJob/hvd: spec.mpiReplicaSpecs.Launcher: required"),
    ("mpijob", put(("spec", "mpiReplicaSpecs", "Launcher", "replicas"), 2),
     "MPIJob/hvd: spec.mpiReplicaSpecs.Launcher.replicas: must be 1"),
    ("mpijob", drop(MPI_WORKER + ("replicas",)), "MPIJob/hvd: spec.mpiReplicaSpecs.Worker.replicas: required, at least 1"),
    ("mpijob", put(MPI_WORKER + ("restartPolicy",), "Always"),
     "MPIJob/hvd: spec.mpiReplicaSpecs.Worker.restartPolicy: must be Never or OnFailure"),
    ("mpijob", put(("spec", "launcherCreationPolicy"), "WaitForWorkers"),
     "MPIJob/hvd: spec.launcherCreationPolicy: must be AtStartup or WaitForWorkersReady"),
    ("mpijob", put(("metadata", "name"), "h" * 60), "MPIJob/" + "h" * 60 + ": metadata.name: the last worker's host name"),
]


@pytest.mark.parametrize("name, change, expected", OPERATOR, ids=[o[2].split(": ")[1] for o in OPERATOR])
def test_what_the_operator_refuses_is_reported_as_its_rule(name, change, expected):
    broken = doc(name)
    change(broken)
    found = problems(broken)
    assert [p for p in found if p.startswith(expected)] and all(p.endswith("(operator rule)") for p in found), found


def test_each_problem_is_reported_once_and_all_are_listed_for_crd_kinds():
    # The CRD schema and kubernetes-validate both see an embedded container's unknown key: one problem.
    broken = doc("mpijob")
    put(MPI_WORKER + ("template", "spec", "containers", 0, "imagee"), "x")(broken)
    put(("spec", "launcherCreationPolicy"), 1)(broken)
    rename(("spec", "slotsPerWorker"), "slots")(broken)
    assert problems(broken) == [
        "MPIJob/hvd: spec.launcherCreationPolicy: 1 is not of type 'string'",
        "MPIJob/hvd: spec.mpiReplicaSpecs.Worker.template.spec.containers[0].imagee: unknown field",
        "MPIJob/hvd: spec.slots: unknown field",
    ]


def test_an_embedded_job_template_is_also_checked_as_a_kubernetes_job(monkeypatch):
    # Take the CRD schema's word out of it: what is left is the kubernetes-validate check of the template.
    broken = doc("jobset")
    put(JS_POD + ("containers", 0, "imagee"), "x")(broken)
    monkeypatch.setattr(k8sschemas, "crd_validator", lambda name: type("Pass", (), {"iter_errors": lambda s, d: []})())
    assert problems(broken) == [
        "JobSet/js: spec.replicatedJobs[0].template.spec.template.spec.containers[0].imagee: unknown field"]


def test_trainjob_keys_the_model_drops_are_reported():
    broken = doc("trainjob")
    put(("spec", "trainer", "image"), None)(broken)
    put(("spec", "trainer", "resourcesPerNode", "limits", "nvidia.com/gpu"), True)(broken)
    assert problems(broken) == ["TrainJob/tj: spec.trainer.resourcesPerNode.limits[\"nvidia.com/gpu\"]: True is not a "
                                "quantity (a string such as 8Gi, or a number)"]
    put(("spec", "trainer", "resourcesPerNode", "limits", "nvidia.com/gpu"), 1)(broken)
    assert problems(broken) == ["TrainJob/tj: spec.trainer.image: null value"]


def test_an_unknown_kind_has_no_schema():
    assert problems({"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "metadata": {"name": "old"}}) == [
        "MPIJob/old: no schema for kubeflow.org/v1/MPIJob"]
    assert problems({"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {"name": "x"}}) == [
        "ConfigMapp/x: no schema for v1/ConfigMapp"]
    assert problems({"kind": "ConfigMap", "metadata": {"name": "x"}}) == [
        "ConfigMap/x: apiVersion and kind: both required, as strings"]


def test_a_stream_is_checked_document_by_document():
    stream = "---\n".join(VALID[name] for name in sorted(VALID))
    assert problems_in_stream(stream) == []
    bad = copy.deepcopy(doc("tfjob"))
    bad["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    found = problems_in_stream(stream + "---\n" + yaml.safe_dump(bad) + "---\n- a list\n")
    assert found == ["TFJob/tf: spec.tfReplicaSpecs.Worker.replicas: 'two' is not of type 'integer'",
                     f"document {len(VALID) + 1}: not a mapping but list"]


def test_strict_closes_objects_and_honours_int_or_string_nullable_and_preserve_unknown_fields():
    import jsonschema
    schema = k8sschemas.strict({"type": "object", "properties": {
        "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "note": {"type": "string", "nullable": True},
        "mode": {"type": "string", "enum": ["a"], "nullable": True},
        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {"type": "string"}}},
        "map": {"type": "object", "additionalProperties": {"type": "string"}},
        "default": {"type": "object", "default": {"description": "a value, kept"}, "properties": {}},
    }})
    check = jsonschema.Draft7Validator(schema)
    assert check.is_valid({"port": 1, "note": None, "mode": None, "open": {"b": 1}, "map": {"k": "v"}})
    assert check.is_valid({"port": "http"})
    assert not check.is_valid({"port": 1.5})
    assert not check.is_valid({"other": 1})
    assert not check.is_valid({"map": {"k": 1}})
    assert schema["properties"]["default"]["default"] == {"description": "a value, kept"}
    assert "nullable" not in schema["properties"]["note"]


def test_the_pinned_kubernetes_version_is_one_kubernetes_validate_ships():
    assert kubernetes_validate.validate(doc("configmap"), k8sschemas.K8S_VERSION, strict=True) == "1.37"


def test_the_vendored_mpijob_schema_has_the_fields_kit_writes():
    spec = k8sschemas.crd_validator("mpijob-v2beta1").schema["properties"]["spec"]["properties"]
    assert {"launcherCreationPolicy", "sshAuthMountPath", "runLauncherAsWorker", "mpiImplementation"} <= set(spec)
