"""kit's jobs as Kubernetes manifests (kit.backends.k8s.manifests), the pure parts: every kind for every launcher it runs, against
reviewed golden files and the objects' own schemas (core objects with kubernetes-validate --strict, the operators'
kinds with their CRDs' schemas, TrainJob with Kubeflow Trainer's models: tests/unit/k8sschemas.py); secrets by
reference only; what a pod's task (kit.backends.k8s.podtask) does, run for real with local processes. tests/lab/test_k8s_pods.py
runs the pods of the manifests in containers of kit's image, as the kubelet would."""

import inspect
import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kit.backends.k8s import manifests as k8s
from kit.backends.cluster.supervisor import heartbeats, launch, shipped
from kit.backends.k8s import jobs as k8sjobs
from kit.backends.k8s import podtask
from kit.backends.slurm import sbatch
from kit.backends.slurm import task as slurmtask
from kit.jobs.commands.horovod import rank_launcher
from kit.errors import BadInput

DATA = Path(__file__).parent / "data" / "k8s-golden"
IMAGE = "registry.lab.example:5000/kit/horovod-cpu:1"
FILES = {"train.py": (b"import horovod.torch as hvd\nhvd.init()\nprint(hvd.rank())\n", False),
         "run.sh": (b"#!/bin/sh\nexec python train.py\n", True),
         "data/labels.bin": (bytes(range(256)), False)}
VARIABLES = (("OMP_NUM_THREADS", "4"), ("WANDB_API_KEY", "s3cr3t-wandb"), ("DATABASE_URL", "postgres://u:pw@db/x"))
SHAPES = {"horovod": (2, 4, None, 2), "torchrun": (2, None, 4, 4), "tf": (3, None, None, None)}
CASES = [(kind, launcher) for kind, launchers in k8s.KINDS.items() for launcher in launchers]
OWN = {".kit/kit_pod.py": inspect.getsource(podtask), ".kit/kit_task.py": inspect.getsource(slurmtask),
       ".kit/kit_rank.py": rank_launcher()}
BEATS = {".kit/kit_beats.py": shipped.source((launch, heartbeats))}  # with the hang watch


def job(kind: str, launcher: str, **changes) -> k8s.K8sJob:
    nodes, np, per_node, gpus = SHAPES[launcher]
    values = dict(name="kit-train", kind=kind, launcher=launcher, script="train.py", args=("--epochs", "2", "it's"),
                  shape=sbatch.shape(launcher, nodes, np, per_node, gpus), image=IMAGE, files=FILES,
                  variables=VARIABLES, namespace="ml")
    return k8s.K8sJob(**{**values, **changes})


def reviewed(text: str) -> str:
    """The stream with kit's own files in the ConfigMap said by name (test_the_configmap_holds_kits_files_as_they_are
    checks them): the golden files hold what a reviewer reads."""
    docs = list(yaml.safe_load_all(text))
    paths = {i["key"]: i["path"] for v in _volumes(docs) for i in v["configMap"]["items"]}
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            for key in doc["data"]:
                if paths[key] in OWN:
                    doc["data"][key] = f"(kit's {paths[key]})"
    return yaml.dump_all(docs, Dumper=k8s._Dumper, sort_keys=False, width=120)


def _volumes(docs):
    for doc in docs:
        yield from _find(doc, lambda d: isinstance(d, dict) and "configMap" in d)


def _find(node, wanted):
    if wanted(node):
        yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from _find(value, wanted)
    elif isinstance(node, list):
        for value in node:
            yield from _find(value, wanted)


@pytest.mark.parametrize("kind, launcher", CASES, ids=[f"{k}-{w}" for k, w in CASES])
def test_each_kinds_manifests_are_the_reviewed_ones(kind, launcher):
    """KIT_UPDATE_GOLDEN=1 writes them again: then read the diff as a reviewer would."""
    text = reviewed(k8s.render(job(kind, launcher)))
    golden = DATA / f"{kind}-{launcher}.yaml"
    if os.environ.get("KIT_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("kind, launcher", CASES, ids=[f"{k}-{w}" for k, w in CASES])
@pytest.mark.parametrize("pvc", [None, "team-datasets"], ids=["configmap", "pvc"])
def test_each_kinds_manifests_pass_their_schemas(kind, launcher, pvc):
    from k8sschemas import problems_in_stream
    assert problems_in_stream(k8s.render(job(kind, launcher, workspace_pvc=pvc))) == []


def test_every_golden_file_is_one_of_the_cases():
    assert sorted(p.name for p in DATA.glob("*.yaml")) == sorted(f"{k}-{w}.yaml" for k, w in CASES)


@pytest.mark.parametrize("kind, launcher", CASES, ids=[f"{k}-{w}" for k, w in CASES])
def test_a_secret_value_is_never_in_the_manifests(kind, launcher):
    text = k8s.render(job(kind, launcher))
    assert "s3cr3t" not in text and "pw@db" not in text
    refs = [e for e in _find(list(yaml.safe_load_all(text)), lambda d: isinstance(d, dict) and "valueFrom" in d)]
    assert {(e["name"], e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in refs} == {
        ("WANDB_API_KEY", "kit-train-env", "WANDB_API_KEY"), ("DATABASE_URL", "kit-train-env", "DATABASE_URL")}
    assert {"name": "OMP_NUM_THREADS", "value": "4"} in _find(list(yaml.safe_load_all(text)),
                                                            lambda d: isinstance(d, dict) and "value" in d)
    assert not any(doc["kind"] == "Secret" for doc in yaml.safe_load_all(text))


def test_the_jobs_env_files_beside_the_script_reach_no_configmap(tmp_path):
    from kit.cli.backends.k8s import make_job
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "vars.txt").write_text("WANDB_API_KEY=s3cr3t-1\n")
    (tmp_path / ".env").write_text("WANDB_API_KEY=s3cr3t-2\n")
    (tmp_path / "prod.env").write_text("WANDB_API_KEY=s3cr3t-3\n")
    made = make_job(tmp_path / "train.py", [], "horovod", "indexed-job", sbatch.shape("horovod", 2, None, None, None),
                    "registry.lab:5000/kit:1", (("WANDB_API_KEY", "s3cr3t-1"),), None, None, None, "kit-train",
                    (tmp_path / "vars.txt",))
    assert set(made.files) == {"train.py"}
    assert "s3cr3t" not in k8s.render(made)


def test_the_configmap_holds_kits_files_as_they_are_and_the_jobs_at_their_paths():
    docs = list(yaml.safe_load_all(k8s.render(job("indexed-job", "horovod"))))
    cm = docs[0]
    items = {i["path"]: i for v in _volumes(docs) for i in v["configMap"]["items"]}
    for path, text in OWN.items():
        assert cm["data"][items[path]["key"]] == text
    assert cm["data"][items["train.py"]["key"]] == FILES["train.py"][0].decode()
    import base64
    assert base64.b64decode(cm["binaryData"][items["data/labels.bin"]["key"]]) == bytes(range(256))
    assert items["run.sh"]["mode"] == 0o755 and items["train.py"]["mode"] == 0o644


@pytest.mark.parametrize("kind, launcher", [("indexed-job", "horovod"), ("jobset", "torchrun"),
                                          ("mpijob", "horovod"), ("pytorchjob", "torchrun"), ("tfjob", "tf"),
                                          ("trainjob", "torchrun")])
def test_only_the_jobs_own_pods_may_connect_to_them(kind, launcher):
    """Horovod's rendezvous takes unauthenticated GET/PUT/DELETE, and Gloo, NCCL and torchrun's store whatever
    connects: a NetworkPolicy admits the job's own pods alone, selected by the label every pod of the job carries."""
    docs = list(yaml.safe_load_all(k8s.render(job(kind, launcher))))
    policy, = [d for d in docs if d["kind"] == "NetworkPolicy"]
    name = docs[0]["metadata"]["name"].removesuffix("-files")
    own = {"matchLabels": {k8s.LABEL: name}}
    assert policy["spec"] == {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]}
    templates = list(_find(docs, lambda d: isinstance(d, dict) and "spec" in d and "containers" in d["spec"]))
    assert templates and all(t["metadata"]["labels"][k8s.LABEL] == name for t in templates)  # every pod it selects


@pytest.mark.parametrize("kind, launcher", CASES, ids=[f"{k}-{w}" for k, w in CASES])
def test_no_pod_of_the_job_gets_an_api_token(kind, launcher):
    """Job code is untrusted, and the namespace's default account may read Secrets (another job's variables): its
    pods mount no token. A TrainJob's pods are its runtime's: a runtime patch cannot say it (SECURITY.md)."""
    docs = list(yaml.safe_load_all(k8s.render(job(kind, launcher))))
    templates = list(_find(docs, lambda d: isinstance(d, dict) and "spec" in d and "containers" in d["spec"]))
    assert templates
    if kind == "trainjob":
        assert all("automountServiceAccountToken" not in t["spec"] for t in templates)
    else:
        assert all(t["spec"]["automountServiceAccountToken"] is False for t in templates), kind


def test_a_pvc_workspace_carries_kits_files_alone():
    docs = list(yaml.safe_load_all(k8s.render(job("indexed-job", "horovod", workspace_pvc="team-datasets"))))
    assert {i["path"] for v in _volumes(docs) for i in v["configMap"]["items"]} == set(OWN)
    claims = list(_find(docs, lambda d: isinstance(d, dict) and "persistentVolumeClaim" in d))
    assert claims == [{"name": "workspace", "persistentVolumeClaim": {"claimName": "team-datasets"}}]
    assert {"name": "KIT_STAGE", "value": ""} in docs[-1]["spec"]["template"]["spec"]["containers"][0]["env"]


def test_the_operators_quirks():
    """PyTorchJob's container is pytorch, TFJob's tensorflow; MPIJob's launcher waits for its workers, with the
    operator's SSH at /root/.ssh (mode 0600 only there) and its hostfile passed by name; /dev/shm is memory, half of
    the pod's."""
    pt = list(yaml.safe_load_all(k8s.render(job("pytorchjob", "torchrun"))))[-1]
    assert {s["template"]["spec"]["containers"][0]["name"] for s in pt["spec"]["pytorchReplicaSpecs"].values()} == \
        {"pytorch"}
    assert pt["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1  # 2 nodes: a master and a worker
    tf = list(yaml.safe_load_all(k8s.render(job("tfjob", "tf"))))[-1]
    assert tf["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] == "tensorflow"
    mpi = list(yaml.safe_load_all(k8s.render(job("mpijob", "horovod"))))[-1]
    assert mpi["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady" and mpi["spec"]["sshAuthMountPath"] == \
        "/root/.ssh"
    assert mpi["spec"]["slotsPerWorker"] == 2 and mpi["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert "nvidia.com/gpu" not in str(mpi["spec"]["mpiReplicaSpecs"]["Launcher"])
    assert "/etc/mpi/hostfile" in inspect.getsource(podtask.mpi_launcher)
    for kind, launcher in CASES:
        docs = list(yaml.safe_load_all(k8s.render(job(kind, launcher))))
        shm = list(_find(docs, lambda d: isinstance(d, dict) and d.get("name") == "dshm" and "emptyDir" in d))
        want = f"{k8s.MEMORY_PER_RANK_GI * job(kind, launcher).ranks_per_pod * 1024 // 2}Mi"
        assert shm and all(v["emptyDir"] == {"medium": "Memory", "sizeLimit": want} for v in shm), kind


def containers(docs: list) -> list[dict]:
    return list(_find(docs, lambda d: isinstance(d, dict) and "image" in d and "command" in d))


@pytest.mark.parametrize("kind, launcher", [c for c in CASES if c[0] != "trainjob"])
def test_every_ranks_container_is_sized_unprivileged_and_its_pods_tolerate_the_gpu_taint(kind, launcher):
    """Requests equal to limits (the Guaranteed class): --cpus and --memory for each pod, else 2 CPUs and 8Gi for
    each rank it runs; the GPUs asked for; no privilege escalation and every capability dropped but a rank's own
    files' (an MPIJob's worker also sshd's); RuntimeDefault seccomp; pods with GPUs tolerate nvidia.com/gpu (an MPIJob
    launcher, which has none, does not); the objects go a week after the job ends."""
    sized = job(kind, launcher, cpus="12", memory="48Gi")
    docs = list(yaml.safe_load_all(k8s.render(sized)))
    gpus = sized.shape.gpus_per_node
    for c in containers(docs):
        r, caps = c["resources"], c["securityContext"]["capabilities"]
        assert r["requests"] == r["limits"] and c["securityContext"]["allowPrivilegeEscalation"] is False
        assert caps["drop"] == ["ALL"]
        if c["name"] == "launcher":
            assert r["limits"] == {"cpu": "1", "memory": "2Gi"} and caps["add"] == k8s.RANK_CAPABILITIES
        else:
            assert r["limits"] == {"cpu": "12", "memory": "48Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
            assert caps["add"] == (k8s.SSHD_CAPABILITIES if c["name"] == "worker" else k8s.RANK_CAPABILITIES)
    pods = list(_find(docs, lambda d: isinstance(d, dict) and "containers" in d and "restartPolicy" in d))
    assert pods and all(p["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}} for p in pods)
    for p in pods:
        tolerates = p.get("tolerations") == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert tolerates == bool(gpus and p["containers"][0]["name"] != "launcher"), (kind, p["containers"][0]["name"])
    assert "ttlSecondsAfterFinished: 604800" in k8s.render(sized)
    default = containers(list(yaml.safe_load_all(k8s.render(job(kind, launcher)))))
    ranks = job(kind, launcher).ranks_per_pod
    assert {c["resources"]["limits"]["memory"] for c in default if c["name"] != "launcher"} == {f"{8 * ranks}Gi"}


@pytest.mark.parametrize("changes, says", [(dict(cpus="lots"), "--cpus: 'lots' is not a CPU count"),
                                           (dict(cpus="0"), "--cpus: '0' is not"),
                                           (dict(memory="8GB"), "--memory: '8GB' is not a memory size"),
                                           (dict(memory="1Mi"), "--memory: '1Mi' is not a memory size of 64Mi")])
def test_a_size_kubernetes_would_not_read_is_bad_input(changes, says):
    with pytest.raises(BadInput, match=says):
        k8s.render(job("indexed-job", "horovod", **changes))


def test_an_export_is_named_for_what_it_holds_and_its_secret_for_the_script():
    """A changed job is another name (its Job's pod template cannot change in place), the same job the same name;
    the Secret of its variables keeps the script's name for every export."""
    one, same = k8s.export_name(job("indexed-job", "horovod")), k8s.export_name(job("indexed-job", "horovod"))
    other = k8s.export_name(job("indexed-job", "horovod", args=("--epochs", "3")))
    assert one.name == same.name != other.name and re.fullmatch(r"kit-train-[0-9a-f]{5}", one.name)
    assert one.secret_name == other.secret_name == "kit-train-env"
    assert "name: kit-train-env" in k8s.render(one) and f"name: {one.name}\n" in k8s.render(one)


@pytest.mark.parametrize("changes, says", [
    (dict(kind="pytorchjob", launcher="horovod"), "--kind pytorchjob runs torchrun, not horovod"),
    (dict(kind="mpijob", launcher="tf"), "--kind mpijob runs horovod, not tf"),
    (dict(kind="tfjob", launcher="tf", shape=sbatch.shape("tf", 2, None, 2, None)), "one TensorFlow worker a pod"),
    (dict(namespace="ML_team"), "--namespace: 'ML_team' is not"),
    (dict(workspace_pvc="a b"), "--workspace-pvc: 'a b' is not"),
    # 700 KiB that is not text is 934 KiB of base64
    (dict(files={"big.bin": (b"\xff" * (700 * 1024), False)}), "KiB in a ConfigMap, more than the 900 KiB"),
    (dict(files={"..data/x.py": (b"", False)}), "..data/x.py: a name starting with .."),
    (dict(files={"sub/..x": (b"", False)}), "sub/..x: a name starting with .."),
    (dict(variables=(("JOB_COMPLETION_INDEX", "0"),)), "-e JOB_COMPLETION_INDEX: kit or the operator sets it"),
    (dict(variables=(("PET_NNODES", "3"),)), "-e PET_NNODES: kit or the operator sets it"),
    (dict(variables=(("KIT_POD_NAMES", "x"),)), "-e KIT_POD_NAMES: kit or the operator sets it"),
    (dict(image="not an image!!"), "--image: 'not an image!!' is not an image reference"),
    (dict(pull_secret="Regcred"), "--image-pull-secret: 'Regcred' is not a Kubernetes name"),
    (dict(kind="deployment"), "--kind: 'deployment' is not a kind kit writes"),
    (dict(script="train\n.py"), "a control character"),
])
def test_what_kubernetes_would_refuse_is_bad_input(changes, says):
    kind, launcher = changes.pop("kind", "indexed-job"), changes.pop("launcher", "horovod")
    with pytest.raises(BadInput, match=says.replace("(", r"\(")):
        k8s.render(job(kind, launcher, **changes))


@pytest.mark.parametrize("script, name", [("train.py", "kit-train"), ("src/My_Model v2.py", "kit-my-model-v2"),
                                          ("___.py", "kit-job"), ("x" * 80 + ".py", "kit-" + "x" * 36)])
def test_job_names_are_kubernetes_names(script, name):
    assert k8s.job_name(script) == name and k8s.NAME.fullmatch(k8s.job_name(script, "ab12"))


def test_export_needs_no_kit_yaml_and_contacts_nothing(tmp_path):
    from helpers import run_kit
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = run_kit("export", "--to", "k8s", "--kind", "jobset", "--launcher", "torchrun", "--nodes", "2",
                "--image", IMAGE, "train.py", "--epochs", "2", "-e", "HF_TOKEN=hf_s3cr3t", "-o", "job.yaml",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "job.yaml").read_text()
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["ConfigMap", "NetworkPolicy", "JobSet"]
    assert "hf_s3cr3t" not in text + r.stdout + r.stderr
    assert "kubectl create secret generic kit-train-env --from-literal=HF_TOKEN=..." in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "train.py"]


def test_export_to_stdout_is_the_stream_alone(tmp_path):
    from helpers import run_kit
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = run_kit("export", "--to", "k8s", "--image", IMAGE, "train.py", cwd=tmp_path)
    assert r.returncode == 0 and [d["kind"] for d in yaml.safe_load_all(r.stdout)] == ["ConfigMap", "NetworkPolicy",
                                                                                         "Service", "Job"]


@pytest.mark.parametrize("args, says", [
    (["--kind", "tfjob", "t.py"], "error: --kind tfjob runs tf, not horovod"),
    (["--kind", "deployment", "t.py"], "error: --kind: 'deployment' is not a kind kit writes"),
    ([], "error: --to k8s needs the training script"),
    (["missing.py"], "error: missing.py: no such file"),
    (["--kind", "pytorchjob", "--launcher", "torchrun", "--hang-timeout", "60s", "t.py"],
     "error: --hang-timeout: kit's hang watch runs in the pods of --kind indexed-job or jobset"),
    (["--hang-timeout", "soon", "t.py"], "error: --hang-timeout: 'soon' is not a duration"),
])
def test_export_k8s_refuses_bad_input(tmp_path, args, says):
    from helpers import run_kit
    (tmp_path / "t.py").write_text("")
    r = run_kit("export", "--to", "k8s", "--image", IMAGE, *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(says), r.stderr


def test_export_takes_a_hang_timeout_for_k8s_alone(tmp_path):
    """An sbatch script has no watch of kit's (kit's follow is Slurm's watch); the pods have theirs."""
    from helpers import run_kit
    (tmp_path / "t.py").write_text("")
    r = run_kit("export", "--to", "slurm", "--hang-timeout", "60s", "t.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: --hang-timeout: for --to k8s"), r.stderr
    for given, value in ((["--hang-timeout", "0"], []), ([], ["600"])):  # (by default as kit run's: 10 minutes)
        r = run_kit("export", "--to", "k8s", "--image", IMAGE, *given, "t.py", cwd=tmp_path)
        docs = list(yaml.safe_load_all(r.stdout))
        assert r.returncode == 0 and [e["value"] for e in _find(docs, lambda d: isinstance(d, dict) and d.get(
            "name") == "KIT_HANG_TIMEOUT")] == value, r.stderr


# ----------------------------------------------------------------------------------- a pod's task, for real

@pytest.fixture
def mounted(tmp_path):
    """A ConfigMap volume as the kubelet lays it out: each item behind a link into ..data, which links to a
    timestamped folder."""
    real = tmp_path / "mount" / "..2026_11_26_00_00_00.1"
    for path, content in {**{p: t.encode() for p, t in {**OWN, **BEATS}.items()},
                          "train.py": b"import json, os, sys\nc = json.loads(os.environ['TF_CONFIG'])\n"
                                      b"print('worker', c['task']['index'], len(c['cluster']['worker']))\n"
                                      b"print('to stderr', file=sys.stderr)\n"
                                      b"if c['task']['index'] == int(sys.argv[2]):\n    sys.exit(int(sys.argv[1]))\n"
                                      b"import time\ntime.sleep(0 if sys.argv[2] == '-1' else 60)\n",
                          "data/x.txt": b"x"}.items():
        (real / path).parent.mkdir(parents=True, exist_ok=True)
        (real / path).write_bytes(content)
    (tmp_path / "mount" / "..data").symlink_to(real.name)
    for top in (".kit", "train.py", "data"):
        (tmp_path / "mount" / top).symlink_to(f"..data/{top}")
    (tmp_path / "workspace").mkdir()
    return tmp_path


def run_pod(mounted, index: int, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "JOB_COMPLETION_INDEX": str(index), "KIT_POD_NAMES": "localhost localhost",
           "KIT_TASKS_PER_NODE": "2", "KIT_JOB_ID": "kit-train", "KIT_PORT": "29500",
           "KIT_STAGE": str(mounted / "mount")}
    return subprocess.run([sys.executable, "-I", str(mounted / "mount" / ".kit" / "kit_pod.py"), "pod", "tf",
                           "train.py", *args], cwd=mounted / "workspace", env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_pod_copies_the_jobs_files_and_starts_its_ranks_with_their_prefixes(mounted):
    r = run_pod(mounted, 1, "0", "-1")
    assert r.returncode == 0, r.stderr
    assert sorted(line for line in r.stdout.splitlines() if "worker" in line) == \
        ["[2]<stdout>:worker 2 4", "[3]<stdout>:worker 3 4"]
    assert sorted(line[:24] for line in r.stdout.splitlines() if "@@kit-exit" in line) == \
        ["[2]<stdout>:@@kit-exit 0", "[3]<stdout>:@@kit-exit 0"]
    assert "[2]<stderr>:to stderr" in r.stderr and "[3]<stderr>:to stderr" in r.stderr
    ws = mounted / "workspace"
    assert sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*") if p.is_file()) == \
        [".kit/kit_beats.py", ".kit/kit_pod.py", ".kit/kit_rank.py", ".kit/kit_task.py", "data/x.txt", "train.py"]
    assert not any(p.is_symlink() for p in ws.rglob("*"))


def test_a_failing_rank_ends_its_pod_with_its_code_and_stops_the_other(mounted):
    """Rank 3 exits 7 while rank 2 would sleep a minute: the pod ends at once, with 7."""
    r = run_pod(mounted, 1, "7", "3", timeout=30)
    assert r.returncode == 7
    assert "[3]<stdout>:@@kit-exit 7" in r.stdout and "[2]<stdout>:@@kit-exit" not in r.stdout


# The ranks of a hung pod: each TF worker (its index from TF_CONFIG) waits at a line of its own for good.
HUNG = """import json, os, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print("waits", index, flush=True)
while index == 2:
    time.sleep(1)
while True:
    time.sleep(1)
"""


def test_a_pod_whose_ranks_made_no_progress_says_where_each_is_with_its_stack_and_ends(mounted):
    """KIT_HANG_TIMEOUT 3: the pod's ranks (2 and 3, real rank launchers) write heartbeats in a folder of the pod's;
    once neither has moved for 3 s the pod prints where each is and its stack (faulthandler's, on SIGUSR2), and waits
    for the job's other pods with its ranks left as they are; deleted then (SIGTERM), it ends them at once and exits
    HUNG_EXIT. kit's reading
    of those lines names each rank at its line, on the pod kit read them from."""
    (mounted / "mount" / "..2026_11_26_00_00_00.1" / "train.py").write_text(HUNG)
    env = {"PATH": os.environ["PATH"], "JOB_COMPLETION_INDEX": "1", "KIT_POD_NAMES": "localhost localhost",
           "KIT_TASKS_PER_NODE": "2", "KIT_JOB_ID": "kit-train", "KIT_PORT": "29500",
           "KIT_STAGE": str(mounted / "mount"), "KIT_HANG_TIMEOUT": "3"}
    pod = subprocess.Popen([sys.executable, "-I", str(mounted / "mount" / ".kit" / "kit_pod.py"), "pod", "tf",
                            "train.py"], cwd=mounted / "workspace", env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lines, started = [], time.monotonic()
    try:
        for line in iter(pod.stdout.readline, ""):  # (bounded: the pod's own watch, else the kill below)
            lines.append(line.rstrip("\n"))
            if line.startswith("@@kit-hung ") or time.monotonic() - started > 60:
                break
        said = time.monotonic() - started
        pod.send_signal(signal.SIGTERM)
        out, err = pod.communicate(timeout=10)
    finally:
        pod.kill()
    lines += out.splitlines()
    assert pod.returncode == podtask.HUNG_EXIT, "\n".join(lines) + err
    assert 3 <= said < 3 + 2 + 2 + podtask.STACK_WAIT_S, said  # (a heartbeat every 2 s, a reading every second)
    assert "[2]<stdout>:waits 2" in lines and "[3]<stdout>:waits 3" in lines
    hung = [line for line in lines if line.split(" ")[0] in podtask.HANG_LINES]
    assert hung[-1] == "@@kit-hung 3" or hung[-1] == "@@kit-hung 4", hung
    assert not any("@@kit-exit" in line for line in lines)  # the ranks were ended, not finished
    assert not any(line.startswith("[") for line in lines[lines.index(hung[-1]):])  # (they waited on, quiet)
    hangs = k8sjobs.Hangs(4)
    assert all(hangs.feed("kit-train-1-x7k2p", line) for line in hung)
    assert re.fullmatch(r"no rank has made progress for [34] s: rank 2 on kit-train-1-x7k2p is at train.py:5 in "
                        r"<module>; rank 3 on kit-train-1-x7k2p is at train.py:7 in <module>", hangs.report())
    stacks = hangs.stacks()
    assert set(stacks) == {2, 3} and {pod for pod, _ in stacks.values()} == {"kit-train-1-x7k2p"}
    assert "most recent call first" in stacks[2][1] and 'train.py", line 5 in <module>' in stacks[2][1]
    assert 'train.py", line 7 in <module>' in stacks[3][1]


def test_kit_reads_the_pods_hang_lines_and_names_the_rank_somewhere_else():
    """Each pod says where its own ranks are; kit names the rank that is somewhere else than most, on the pod whose
    output it read."""
    hangs = k8sjobs.Hangs(3)
    for pod, rank, where in (("job-0-a", 0, "/workspace/hung.py:19 in <module>"),
                             ("job-0-a", 1, "/workspace/hung.py:17 in <module>"),
                             ("job-1-b", 2, "/workspace/hung.py:19 in <module>")):
        assert hangs.feed(pod, f"@@kit-hang-at {rank} {json.dumps(where)}")
        assert hangs.feed(pod, f"@@kit-hang-stack {rank} " + json.dumps('  File "hung.py", line 1'))
    assert hangs.feed("job-0-a", "@@kit-hung 61") and hangs.feed("job-1-b", "@@kit-hung 62")
    assert hangs.report() == ("no rank has made progress for 62 s: rank 1 on job-0-a is at /workspace/hung.py:17 in "
                              "<module>; the other 2 ranks wait at /workspace/hung.py:19 in <module>")
    assert hangs.settled({"job-0-a", "job-1-b"}) and not hangs.settled({"job-0-a", "job-1-b", "job-2-c"})
    assert not k8sjobs.Hangs(3).settled(set())  # (no pod said it hung)


def test_a_pods_hang_lines_cannot_speak_for_another_pods_ranks_nor_pass_for_output_when_they_are_not_kits():
    """The job's output is untrusted: a line with a watch's mark but no rank's number is no line of output and no
    report; a rank of no pod of the job, one another pod spoke for first, text that is not one JSON string are
    dropped; text is cut; a line with another mark is the pod's output, shown."""
    hangs = k8sjobs.Hangs(2)
    assert hangs.feed("p0", '@@kit-hang-at 0 "a.py:1 in f"')
    assert hangs.feed("p1", '@@kit-hang-at 0 "b.py:2 in g"')          # rank 0 is p0's
    assert hangs.feed("p1", '@@kit-hang-stack 0 "forged"')
    assert hangs.feed("p1", '@@kit-hang-at 7 "c.py:3 in h"')          # the job has 2 ranks
    assert hangs.feed("p1", "@@kit-hang-at 1 not-json")
    assert hangs.feed("p1", '@@kit-hang-at 1 ["a list"]')
    assert hangs.feed("p1", "@@kit-hung soon") and not hangs.hung
    assert hangs.feed("p1", "@@kit-hang-at 1 " + json.dumps("x" * 5000))
    assert not hangs.feed("p1", "@@kit-hangs 1 \"x\"") and not hangs.feed("p1", "kit: job hung")
    assert hangs.where == {0: ("p0", "a.py:1 in f"), 1: ("p1", "x" * k8sjobs.WHERE_CHARS)}
    assert hangs.stacks() == {0: ("p0", ""), 1: ("p1", "")}


def test_kits_hang_watch_reaches_the_pods_of_the_kinds_whose_ranks_kits_pod_task_starts():
    for kind, launcher in CASES:
        docs = list(yaml.safe_load_all(k8s.render(job(kind, launcher, hang_timeout=90))))
        env = [e for e in _find(docs, lambda d: isinstance(d, dict) and d.get("name") == "KIT_HANG_TIMEOUT")]
        items = {i["path"] for v in _volumes(docs) for i in v["configMap"]["items"]}
        watched = kind in ("indexed-job", "jobset")
        assert env == ([{"name": "KIT_HANG_TIMEOUT", "value": "90"}] if watched else []), kind
        assert (".kit/kit_beats.py" in items) == watched, kind
    assert "KIT_HANG_TIMEOUT" not in reviewed(k8s.render(job("indexed-job", "horovod")))  # (0: no watch)


# ------------------------------------------------------------------------------------------------- kit run --on k8s

def kubeconfig(tmp_path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": "lab", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}]}))
    return path


@pytest.mark.skipif(not __import__("shutil").which("kubectl"), reason="kubectl is not installed")
@pytest.mark.parametrize("server, says", [(None, "error: no Kubernetes cluster to run on: kubectl has no current "
                                                  "context"),
                                          ("closed", "error: no Kubernetes cluster answers at kube context lab")])
def test_run_on_k8s_where_no_cluster_answers_says_so_and_points_to_export(tmp_path, server, says):
    """With the real kubectl: no context at all, and a context whose API server refuses the connection."""
    from helpers import closed_port, run_kit
    (tmp_path / "train.py").write_text("print('hi')\n")
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port()}") if server else tmp_path / "none"
    r = run_kit("run", "--on", "k8s", "--image", IMAGE, "train.py", cwd=tmp_path,
                env={"KUBECONFIG": str(config), "KIT_HOME": str(tmp_path / "home")})
    assert r.returncode == 1 and r.stderr.startswith(says), r.stderr
    assert "kit export --to k8s SCRIPT -o job.yaml" in r.stderr
    assert not (tmp_path / "home" / "k8s").exists() or not list((tmp_path / "home" / "k8s").iterdir())


FAKE_KUBECTL = r'''#!/usr/bin/env python3
# kubectl's answers for an API server that runs the job: records each call (argv, input) and answers as kubectl does.
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"argv": args, "stdin": sys.stdin.read() if "--filename=-" in args else ""}) + "\n")
calls = sum(1 for _ in open(os.environ["FAKE_LOG"]))
words = [a for a in args if not a.startswith("--")]
if words[:2] == ["config", "current-context"]:
    print("lab")
elif words[:1] == ["version"]:
    print(json.dumps({"clientVersion": {}, "serverVersion": {"gitVersion": "v1.33.0"}}))
elif words[:1] == ["apply"] and os.environ.get("FAKE_APPLY_FAIL"):
    sys.exit("error: unable to recognize STDIN: no matches for kind")
elif words[:1] in (["apply"], ["create"]):
    print("applied")
elif words[:2] == ["get", "pods"]:
    code = int(os.environ["FAKE_EXIT"])
    pods = [{"metadata": {"name": "kit-train-ab12-%d" % i}, "status": {"phase": "Failed" if code and i else
             "Succeeded", "containerStatuses": [{"state": {"terminated": {"exitCode": code if i else 0,
             "finishedAt": "2026-11-26T10:00:0%dZ" % i}}}]}} for i in range(int(os.environ.get("FAKE_PODS", "2")))]
    print(json.dumps({"items": pods}))
elif words[:1] == ["get"]:
    done = "Failed" if int(os.environ["FAKE_EXIT"]) else "Complete"
    print(json.dumps({"status": {"conditions": [{"type": done, "status": "True"}] if calls > 6 else []}}))
elif words[:1] == ["logs"] and os.environ.get("FAKE_HANG"):  # each pod's hang watch, as podtask prints it
    rank = int(words[1].rsplit("-", 1)[1])
    line = 7 if rank == 1 else 9
    print("[%d]<stdout>:@@kit-hung 1\n[%d]<stdout>:@@kit-hang-at 0 \"forged.py:1\"" % (rank, rank))
    print("@@kit-hang-at %d %s" % (rank, json.dumps("train.py:%d in <module>" % line)))
    print("@@kit-hang-stack %d %s" % (rank, json.dumps("Thread 0x1 (most recent call first):")))
    print("@@kit-hang-stack %d %s" % (rank, json.dumps('  File "train.py", line %d in <module>' % line)))
    print("@@kit-hung 6%d" % rank)
elif words[:1] == ["logs"]:
    rank = int(words[1].rsplit("-", 1)[1])
    print("[%d]<stdout>:loss 0.5\n[%d]<stderr>:\x1b[2Jwarning" % (rank, rank))
elif words[:1] == ["delete"]:
    print("deleted")
'''


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(FAKE_KUBECTL)
    (bin_dir / "kubectl").chmod(0o755)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "calls.jsonl"),
            "KIT_HOME": str(tmp_path / "home")}


def calls(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


def test_run_on_k8s_applies_follows_each_pod_and_ends_with_the_job(tmp_path, fake_kubectl):
    """A unit test of what kit asks kubectl, in which order, and how it reads the answers (a stand-in kubectl: no
    API server can run here)."""
    from helpers import run_kit
    r = run_kit("run", "--on", "k8s", "--image", IMAGE, "--nodes", "2", "train.py", "-e", "HF_TOKEN=hf_s3cr3t",
                cwd=tmp_path, env={**fake_kubectl, "FAKE_EXIT": "0"})
    assert r.returncode == 0, r.stderr
    seen = calls(tmp_path)
    applied = [c for c in seen if "apply" in c["argv"] or "create" in c["argv"]]
    secret, job = json.loads(applied[0]["stdin"]), list(yaml.safe_load_all(applied[1]["stdin"]))
    assert secret["kind"] == "Secret" and secret["stringData"] == {"HF_TOKEN": "hf_s3cr3t"}
    assert applied[0]["argv"][1:] == ["create", "--filename=-"]
    assert applied[1]["argv"][1:] == ["apply", "--server-side", "--field-manager=kit", "--filename=-"]
    assert [d["kind"] for d in job] == ["ConfigMap", "NetworkPolicy", "Service", "Job"]
    assert "hf_s3cr3t" not in applied[1]["stdin"]
    assert not any("hf_s3cr3t" in " ".join(c["argv"]) for c in seen) and "hf_s3cr3t" not in r.stdout + r.stderr
    assert all(c["argv"][0] == "--context=lab" for c in seen[1:])
    name = job[-1]["metadata"]["name"]
    assert re.fullmatch(r"kit-train-[0-9a-f]{4}", name)
    assert "[kit-train-ab12-0 rank 0] loss 0.5" in r.stdout and "[kit-train-ab12-1 rank 1] \\x1b[2Jwarning" in r.stdout
    assert "finished" in r.stdout
    assert seen[-1]["argv"][1:] == ["delete", f"secret/{name}-env", "--ignore-not-found=true", "--wait=true",
                                    "--timeout=60s"]  # the job's Secret does not outlive it


def test_run_on_k8s_exits_with_the_first_failed_pods_code_and_stop_deletes_what_it_applied(tmp_path, fake_kubectl):
    from helpers import run_kit
    r = run_kit("run", "--on", "k8s", "--image", IMAGE, "--nodes", "2", "train.py", cwd=tmp_path,
                env={**fake_kubectl, "FAKE_EXIT": "3"})
    assert r.returncode == 3 and "pod kit-train-ab12-1 failed first (exit 3)" in r.stderr, r.stderr
    d = run_kit("run", "--on", "k8s", "--image", IMAGE, "-d", "train.py", "-e", "TOKEN=x", cwd=tmp_path,
                env={**fake_kubectl, "FAKE_EXIT": "0"})
    assert d.returncode == 0, d.stderr
    job_id = re.search(r"kit: job (\S+) is indexed-job (\S+) ", d.stdout)
    s = run_kit("stop", job_id[1], cwd=tmp_path, env={**fake_kubectl, "FAKE_EXIT": "0"})
    assert s.returncode == 0, s.stderr
    name = job_id[2]
    assert calls(tmp_path)[-1]["argv"][1:] == ["delete", f"configmap/{name}-files", f"networkpolicy/{name}",
                                               f"service/{name}", f"job/{name}", f"secret/{name}-env",
                                               "--ignore-not-found=true", "--wait=true", "--timeout=60s"]
    again = run_kit("stop", job_id[1], cwd=tmp_path, env={**fake_kubectl, "FAKE_EXIT": "0"})
    assert again.returncode == 0 and "had ended (stopped)" in again.stdout  # an ended job's objects go too
    logs = run_kit("logs", job_id[1], "--rank", "1", cwd=tmp_path, env={**fake_kubectl, "FAKE_EXIT": "0"})
    assert logs.returncode == 0 and logs.stdout.splitlines() == ["[kit-train-ab12-1 rank 1] loss 0.5",
                                                                 "[kit-train-ab12-1 rank 1] \\x1b[2Jwarning"]
    listed = run_kit("jobs", "--json", cwd=tmp_path, env={**fake_kubectl, "FAKE_EXIT": "0"})
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert listed.returncode == 0 and {(r["on"], r["state"], r["exit"]) for r in rows} == {
        ("k8s", "failed", 3), ("k8s", "stopped", None)}, listed.stderr


def test_run_on_k8s_names_the_hung_rank_from_its_pods_lines_keeps_their_stacks_and_deletes_the_job(tmp_path,
                                                                                                   fake_kubectl):
    """Each pod's watch says where its rank is (a stand-in kubectl's logs, as podtask prints them): kit names rank 1
    and its pod, keeps each rank's stack in its home, deletes the job and records it hung; a rank's line that looks
    like a watch's is the rank's output."""
    from helpers import run_kit
    env = {**fake_kubectl, "FAKE_EXIT": "124", "FAKE_HANG": "1", "FAKE_PODS": "3"}
    r = run_kit("run", "--on", "k8s", "--image", IMAGE, "--nodes", "3", "--hang-timeout", "60s", "train.py",
                cwd=tmp_path, env=env)
    said = " ".join(r.stderr.split())
    assert r.returncode == 1, r.stdout + r.stderr
    job_id = re.search(r"kit: job (\S+) is indexed-job", r.stdout)[1]
    assert "hang watch: 60 s without progress" in r.stdout
    assert (f"error: job {job_id} hung: no rank has made progress for 62 s: rank 1 on kit-train-ab12-1 is at "
            "train.py:7 in <module>; the other 2 ranks wait at train.py:9 in <module>; its objects were deleted, "
            "every rank's stack is in ") in said, said
    assert "[kit-train-ab12-1 rank 1] @@kit-hang-at 0 \"forged.py:1\"" in r.stdout  # a rank's line: output
    assert "[kit-train-ab12-1 rank 1] @@kit-hung 1" in r.stdout and "@@kit-hang-stack" not in r.stdout
    name = [c for c in calls(tmp_path) if c["argv"][1:2] == ["apply"]]
    deleted = [c["argv"] for c in calls(tmp_path) if "delete" in c["argv"]]
    assert any(any(a.startswith("job/kit-train-") for a in argv) for argv in deleted) and name
    stacks = Path(fake_kubectl["KIT_HOME"]) / "k8s" / f"{job_id}-stacks"
    assert (stacks / "rank-1.txt").read_text() == ("rank 1 on kit-train-ab12-1\nThread 0x1 (most recent call first):\n"
                                                   '  File "train.py", line 7 in <module>\n')
    assert sorted(p.name for p in stacks.iterdir()) == ["rank-0.txt", "rank-1.txt", "rank-2.txt"]
    listed = run_kit("jobs", "--json", cwd=tmp_path, env=env)
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["state"] == "failed" and row["hang"].startswith("no rank has made progress for 62 s: rank 1 on")
    table = run_kit("jobs", cwd=tmp_path, env={**env, "COLUMNS": "200"})
    assert "failed (hung)" in table.stdout and f"{job_id} hung: no rank has made progress" in table.stdout


def test_a_detached_jobs_secret_goes_the_first_time_kit_sees_it_ended(tmp_path, fake_kubectl):
    """No kit follows a detached job to its end: `kit jobs` (or `kit logs -f`) that first sees it ended deletes its
    Secret, as `kit run` does for a job it follows, and records the end, so the next look deletes nothing."""
    from helpers import run_kit
    env = {**fake_kubectl, "FAKE_EXIT": "0"}
    d = run_kit("run", "--on", "k8s", "--image", IMAGE, "-d", "train.py", "-e", "TOKEN=x", cwd=tmp_path, env=env)
    assert d.returncode == 0, d.stderr
    name = re.search(r"kit: job (\S+) is indexed-job (\S+) ", d.stdout)[2]
    assert not any("delete" in c["argv"] for c in calls(tmp_path))
    for _ in range(5):  # (the stand-in API server says the job completed after a few calls)
        listed = run_kit("jobs", "--json", cwd=tmp_path, env=env)
        states = [json.loads(line)["state"] for line in listed.stdout.splitlines()]
        assert listed.returncode == 0 and states in (["running"], ["succeeded"]), listed.stderr
        if states == ["succeeded"]:
            break
    assert states == ["succeeded"]
    deleted = [c["argv"][1:] for c in calls(tmp_path) if "delete" in c["argv"]]
    assert deleted == [["delete", f"secret/{name}-env", "--ignore-not-found=true", "--wait=true", "--timeout=60s"]]
    run_kit("jobs", "--json", cwd=tmp_path, env=env)
    assert len([c for c in calls(tmp_path) if "delete" in c["argv"]]) == 1


def test_a_link_out_of_the_jobs_folder_is_left_out_and_said_and_a_link_within_it_is_carried(tmp_path):
    from helpers import run_kit
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text("print('hi')\n")
    (tmp_path / "secret.txt").write_text("the machine's own\n")
    (job / "notes.txt").symlink_to(tmp_path / "secret.txt")
    (job / "main.py").symlink_to("train.py")
    r = run_kit("export", "--to", "k8s", "--image", IMAGE, "job/main.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "left out 1 link(s) of the job's folder (a ConfigMap carries files, not links): notes.txt" in r.stderr
    configmap = next(yaml.safe_load_all(r.stdout))
    assert "the machine's own" not in r.stdout and configmap["data"] and "print('hi')\n" in configmap["data"].values()
    (job / "outside.py").symlink_to(tmp_path / "secret.txt")
    r = run_kit("export", "--to", "k8s", "--image", IMAGE, "job/outside.py", cwd=tmp_path)
    assert r.returncode == 2 and "job/outside.py: a link to a file outside its folder" in r.stderr, r.stderr


def test_a_folder_too_large_for_a_configmap_is_refused_before_it_is_read(tmp_path):
    from helpers import run_kit
    (tmp_path / "train.py").write_text("print('hi')\n")
    with open(tmp_path / "data.bin", "wb") as f:
        f.truncate(64 << 20)  # sparse: what would be read is 64 MiB
    r = run_kit("export", "--to", "k8s", "--image", IMAGE, "train.py", cwd=tmp_path)
    assert r.returncode == 2 and "more than the 900 KiB kit puts in a ConfigMap (largest: data.bin 65536 KiB" in \
        r.stderr, r.stderr
    assert "--workspace-pvc NAME" in r.stderr


class Answers:
    """A runner that answers kubectl's commands from a table (a unit test of how kit reads the answers)."""

    host = "kubectl"
    sudo = False

    def __init__(self, answer):
        self.answer, self.seen = answer, []

    def run(self, command, **kw):
        from kit.runners.base import Result
        self.seen.append(command)
        code, out = self.answer(command)
        return Result("kubectl", command, code, out, "" if code == 0 else "Error from server (NotFound)"
                      if out == "gone" else "connection refused")

    def stream_out(self, command, on_line, **kw):
        return 0


def record():
    from kit.backends.k8s import jobs as k8sjobs
    return k8sjobs.K8sRecord("20261126-100000-ab12", "kit-train-ab12", "indexed-job", "lab", None, "horovod",
                             "train.py", 2, 0.0, ("configmap/kit-train-ab12-files",))


def test_a_pod_that_cannot_pull_its_image_ends_the_follow_with_the_fix(monkeypatch):
    from kit.backends.k8s import jobs as k8sjobs
    from kit.errors import KitError
    pod = {"metadata": {"name": "kit-train-ab12-0-x7k2p"}, "status": {"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}}
    runner = Answers(lambda c: (0, json.dumps({"items": [pod]}) if " pods " in c else json.dumps({"status": {}})))
    clock = iter(range(0, 10_000, 60))
    monkeypatch.setattr(k8sjobs.time, "monotonic", lambda: next(clock))
    shown = []
    with pytest.raises(KitError, match="pod kit-train-ab12-0-x7k2p has not started in 180 s: ImagePullBackOff"):
        k8sjobs.follow(runner, record(), lambda *a: shown.append(a), sleep=lambda s: None)
    assert shown == [("kit-train-ab12-0-x7k2p", None, "kit: waiting: ImagePullBackOff (Back-off pulling image)")]


def test_a_hiccup_of_kubectl_is_waited_out_and_five_in_a_row_end_the_follow():
    from kit.backends.k8s import jobs as k8sjobs
    from kit.errors import KitError
    answers = iter([(1, "")] * 4 + [(0, json.dumps({"status": {"conditions": [{"type": "Complete",
                                                                                "status": "True"}]}})),
                                    (0, json.dumps({"items": []}))])
    assert k8sjobs.follow(Answers(lambda c: next(answers)), record(), print, sleep=lambda s: None).state == \
        "succeeded"
    with pytest.raises(KitError, match="cannot read job"):
        k8sjobs.follow(Answers(lambda c: (1, "")), record(), print, sleep=lambda s: None)


def test_an_apply_that_fails_half_way_deletes_what_it_made(tmp_path, fake_kubectl):
    from helpers import run_kit
    r = run_kit("run", "--on", "k8s", "--image", IMAGE, "train.py", "-e", "TOKEN=x", cwd=tmp_path,
                env={**fake_kubectl, "FAKE_EXIT": "0", "FAKE_APPLY_FAIL": "1"})
    assert r.returncode == 1 and "kubectl apply of job" in r.stderr, r.stderr
    last = calls(tmp_path)[-1]["argv"]
    assert last[1] == "delete" and any(a.startswith("secret/") for a in last)
    listed = run_kit("jobs", "--json", cwd=tmp_path, env={**fake_kubectl, "FAKE_EXIT": "0"})
    assert [json.loads(line)["state"] for line in listed.stdout.splitlines()] == ["failed"]


@pytest.mark.parametrize("kind, launcher", CASES, ids=[f"{k}-{w}" for k, w in CASES])
def test_an_image_pull_secret_reaches_every_pod(kind, launcher):
    from k8sschemas import problems_in_stream
    text = k8s.render(job(kind, launcher, pull_secret="regcred"))
    assert problems_in_stream(text) == []
    specs = list(_find(list(yaml.safe_load_all(text)), lambda d: isinstance(d, dict) and "volumes" in d))
    assert specs and all(s.get("imagePullSecrets") == [{"name": "regcred"}] for s in specs), kind
