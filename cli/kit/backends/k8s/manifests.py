"""A kit job as Kubernetes manifests: settings in, one YAML stream out. Pure.

It is what `kit export --to k8s` prints and what `kit run --on k8s` applies. As under Slurm (kit.backends.slurm.sbatch), the
scheduler starts every rank and no SSH runs between pods, except in an MPIJob, whose operator brings its own:

    indexed-job   a batch/v1 Indexed Job and its headless Service (any cluster: no operator). Each pod is one node
                  of the job; kit's pod task (kit.backends.k8s.podtask) starts the node's ranks as srun would, with
                  Horovod's Gloo rendezvous on the first pod, torchrun's c10d store there, or TF_CONFIG.
    jobset        the same pods as one JobSet (jobset.x-k8s.io): its own headless Service, all-or-nothing restarts.
    pytorchjob    torchrun under the training operator (kubeflow.org/v1): the operator's PET_* variables.
    tfjob         one TensorFlow worker a pod under the training operator: the operator's TF_CONFIG.
    mpijob        horovodrun (kit's Gloo build) under the MPI operator (kubeflow.org/v2beta1): its SSH keys and
                  hostfile, host keys checked, the launcher made once every worker is ready.
    trainjob      torchrun as a Kubeflow Trainer TrainJob on the `torch-distributed` runtime.

The job's folder travels as a ConfigMap (copied into the pod's /workspace before the job starts), or the job runs
in a PersistentVolumeClaim that already holds it (--workspace-pvc). A variable whose name is not on kit's short
list of harmless settings (kit.jobs.env.SHOWN) is read from a Secret by reference: its value is never in a manifest.
"""

from __future__ import annotations

import base64
import functools
import inspect
import re
from dataclasses import dataclass, field, replace

import yaml

from kit.backends.cluster.supervisor import heartbeats, launch, shipped
from kit.backends.k8s import podtask
from kit.backends.slurm import task as slurmtask
from kit.jobs.commands.horovod import rank_launcher
from kit.errors import BadInput
from kit.backends.k8s.sizes import (CPUS_PER_RANK, MEMORY_PER_RANK_GI, RANK_CAPABILITIES, SSHD_CAPABILITIES, TTL_S,
                                    check_sizes, memory_bytes)
from kit.jobs.env import shows_value
from kit.image.push import is_image_reference
from kit.backends.slurm.sbatch import IMAGE_PYTHON, Shape

KINDS = {"indexed-job": ("horovod", "torchrun", "tf"), "jobset": ("horovod", "torchrun", "tf"),
         "pytorchjob": ("torchrun",), "tfjob": ("tf",), "mpijob": ("horovod",), "trainjob": ("torchrun",)}
FILES = "/kit/job"              # the ConfigMap's mount: the job's files and kit's (.kit/)
WORKSPACE = "/workspace"        # where the job runs: an emptyDir the files are copied into, or the PVC
POD = f"{FILES}/.kit/kit_pod.py"
RANK = f"{FILES}/.kit/kit_rank.py"
# torchrun's c10d store and Horovod's rendezvous, on the first pod; each pod has its own network namespace.
PORT, RENDEZVOUS_PORT = 29500, 29400
MPI_SSH = "/root/.ssh"          # the MPI operator's keys: mode 0600 only at this path
CONFIGMAP_BYTES = 900 * 1024    # a ConfigMap holds 1 MiB in all (kubectl apply --server-side: no copy in an annotation)
NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
PVC = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
LABEL = "app.kubernetes.io/instance"
# What kit's pod task, the Job controller or an operator sets in a pod: a user's value would replace theirs.
POD_SET = {"JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "TF_CONFIG"}
POD_SET_PREFIXES = ("KIT_", "PET_", "SLURM_", "K_MPI_", "OMPI_MCA_")
WATCHED = ("indexed-job", "jobset")  # the kinds whose ranks kit's pod task starts, and watches (podtask.PodWatch)


@dataclass(frozen=True)
class K8sJob:
    name: str                    # the objects' name (DNS-1035), also the pods' subdomain
    kind: str
    launcher: str
    script: str                  # relative to the job's folder
    args: tuple[str, ...]
    shape: Shape
    image: str
    files: dict[str, tuple[bytes, bool]] = field(default_factory=dict)  # path -> (content, executable)
    variables: tuple[tuple[str, str], ...] = ()
    namespace: str | None = None
    workspace_pvc: str | None = None
    pull_secret: str | None = None  # the Secret the pods pull the image with (a registry that asks for a login)
    cpus: str | None = None         # each pod's CPU request and limit (None: CPUS_PER_RANK for each of its ranks)
    memory: str | None = None       # each pod's memory request and limit (None: MEMORY_PER_RANK_GI Gi a rank)
    secret: str | None = None       # the variables' Secret (None: secret_name(name))
    hang_timeout: float = 0         # seconds without progress of any rank of a pod before it counts as hung (0: none)

    @property
    def secret_name(self) -> str:
        return self.secret or secret_name(self.name)

    @property
    def ranks_per_pod(self) -> int:
        return self.shape.nproc_per_node if self.shape.tasks_per_node == 1 else self.shape.tasks_per_node

    @property
    def pod_cpus(self) -> str:
        return self.cpus or str(CPUS_PER_RANK * self.ranks_per_pod)

    @property
    def pod_memory(self) -> str:
        return self.memory or f"{MEMORY_PER_RANK_GI * self.ranks_per_pod}Gi"

    @property
    def watched(self) -> float:  # the pods' hang timeout (0: none)
        return self.hang_timeout if self.kind in WATCHED else 0

    @property
    def secret_names(self) -> list[str]:
        """The variables read from the Secret: every one whose value kit would not print."""
        return [n for n, v in self.variables if not shows_value(n, v)]


def secret_name(name: str) -> str:
    """The Secret a job's variables are read from (kit run --on k8s makes it; kit export says how)."""
    return f"{name}-env"


def export_name(job: K8sJob) -> K8sJob:
    """kit export's objects are named for what they hold: kit-<script>-<hash of the manifests>. A changed job is
    another name, so applying it never meets the previous one's Job, whose pod template Kubernetes does not let
    change; the same job exported again is the same name (applying it again changes nothing). Its variables' Secret
    keeps the script's name: made once, it serves every export of the job."""
    import hashlib
    base = job_name(job.script)
    digest = hashlib.sha256(render(replace(job, name=base)).encode()).hexdigest()[:5]
    return replace(job, name=job_name(job.script, digest), secret=job.secret or secret_name(base))


def job_name(script: str, suffix: str = "") -> str:
    """kit-<script's stem>[-suffix], as a Kubernetes name: lower case, letters, digits and -, at most 41 characters
    (an Indexed Job's pod names add -<index>, a JobSet's -node-0-<index>, within 63)."""
    stem = script.rsplit("/", 1)[-1].removesuffix(".py").lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")[: 36 - len(suffix)].strip("-") or "job"
    return f"kit-{stem}" + (f"-{suffix}" if suffix else "")


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise BadInput(f"--kind: '{kind}' is not a kind kit writes", hint=f"use one of: {', '.join(KINDS)}")
    return kind


def check(job: K8sJob) -> None:
    """What the kind can run, the names Kubernetes accepts, and what fits a ConfigMap; bad input names the flag,
    variable or file."""
    check_kind(job.kind)
    if job.launcher not in KINDS[job.kind]:
        raise BadInput(f"--kind {job.kind} runs {' or '.join(KINDS[job.kind])}, not {job.launcher}",
                       hint="kinds for " + job.launcher + ": " + ", ".join(k for k, v in KINDS.items()
                                                                           if job.launcher in v))
    if job.kind == "tfjob" and job.shape.tasks_per_node != 1:
        raise BadInput(f"--kind tfjob runs one TensorFlow worker a pod, and this job has {job.shape.tasks_per_node} "
                       "a node (--ntasks-per-node, else --gpus-per-node)",
                       hint="give --ntasks-per-node 1, or use --kind indexed-job or jobset for several workers a pod")
    for flag, value, pattern, top in (("--namespace", job.namespace, NAME, 63),
                                      ("--workspace-pvc", job.workspace_pvc, PVC, 253),
                                      ("--image-pull-secret", job.pull_secret, PVC, 253)):
        if value is not None and not (pattern.fullmatch(value) and len(value) <= top):
            raise BadInput(f"{flag}: {value!r} is not a Kubernetes name",
                           hint=f"lower-case letters, digits and -{'' if pattern is NAME else ' and .'}, starting "
                                f"with a letter or digit, at most {top}")
    check_sizes(job.cpus, job.memory)
    if not is_image_reference(job.image):
        raise BadInput(f"--image: {job.image!r} is not an image reference",
                       hint="give REGISTRY/REPO:TAG, the image `kit push` put in your registry")
    for name, _ in job.variables:
        if name in POD_SET or name.startswith(POD_SET_PREFIXES):
            raise BadInput(f"-e {name}: kit or the operator sets it in every pod", hint=f"drop {name}")
    if any(ord(c) < 32 or c == "\x7f" for c in job.script):
        raise BadInput(f"{job.script!r}: a script's path with a control character", hint="rename the script")
    for path in job.files:
        if any(part.startswith("..") for part in path.split("/")):
            raise BadInput(f"{path}: a name starting with .. (Kubernetes keeps its own files under such names)",
                           hint="rename it, or leave it out with .kitignore")
    if job.workspace_pvc is None and (size := carried(job)) > CONFIGMAP_BYTES:
        raise BadInput(f"the job's folder takes {size // 1024} KiB in a ConfigMap, more than the "
                       f"{CONFIGMAP_BYTES // 1024} KiB kit puts in one",
                       hint="put the folder on a PersistentVolumeClaim and give --workspace-pvc NAME, or leave "
                            "large files out with .kitignore")


def carried(job: K8sJob) -> int:
    """Bytes of the ConfigMap's data: text as it is, other files in base64."""
    return sum(len(data) if _text(data) is not None else (len(data) + 2) // 3 * 4
               for data, _ in _all_files(job).values())


def _text(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def render(job: K8sJob) -> str:
    """The job's objects as one YAML stream, in the order `kubectl apply -f` should create them."""
    check(job)
    objects = [_configmap(job), _network_policy(job)]
    if job.kind == "indexed-job":
        objects += [_service(job), _indexed_job(job)]
    else:
        objects.append({"jobset": _jobset, "pytorchjob": _pytorchjob, "tfjob": _tfjob, "mpijob": _mpijob,
                        "trainjob": _trainjob}[job.kind](job))
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


class _Dumper(yaml.SafeDumper):
    """Files of several lines as YAML's literal blocks, readable as they are in the job's folder."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


# ------------------------------------------------------------------------------------------------------ objects

def _meta(job: K8sJob, name: str | None = None) -> dict:
    meta = {"name": name or job.name}
    if job.namespace:
        meta["namespace"] = job.namespace
    meta["labels"] = {"app.kubernetes.io/managed-by": "kit", LABEL: job.name}
    return meta


def _configmap(job: K8sJob) -> dict:
    """kit's task and rank launcher, and the job's files unless a PVC holds them. A key cannot hold a /: the files
    are keys file-N, and the volume's items put each at its path."""
    data, binary = {}, {}
    for key, (_, (content, _)) in _items(job):
        text = _text(content)
        if text is None:
            binary[key] = base64.b64encode(content).decode()
        else:
            data[key] = text
    out = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, f"{job.name}-files"), "data": data}
    if binary:
        out["binaryData"] = binary
    return out


def _all_files(job: K8sJob) -> dict[str, tuple[bytes, bool]]:
    return {**({} if job.workspace_pvc else job.files), **_own_files(bool(job.watched))}


@functools.cache
def _own_files(watched: bool = False) -> dict[str, tuple[bytes, bool]]:
    """kit's files for the pods; watched, the heartbeats' parser and Watch too (podtask.load_beats loads them)."""
    return {".kit/kit_pod.py": (inspect.getsource(podtask).encode(), False),
            ".kit/kit_task.py": (inspect.getsource(slurmtask).encode(), False),
            ".kit/kit_rank.py": (rank_launcher().encode(), False),
            **({".kit/kit_beats.py": (shipped.source((launch, heartbeats)).encode(), False)} if watched else {})}


def _items(job: K8sJob) -> list[tuple[str, tuple[str, tuple[bytes, bool]]]]:
    """(key, (path, (content, executable))) of every file, in the order of their paths."""
    return [(f"file-{i}", item) for i, item in enumerate(sorted(_all_files(job).items()))]


def _network_policy(job: K8sJob) -> dict:
    """Only the job's own pods may connect to them: Horovod's rendezvous (no authentication), Gloo, NCCL, torchrun's
    store, TensorFlow's workers and an MPIJob's sshd take whatever connection reaches them. Enforced where the
    cluster's network plugin enforces NetworkPolicy (Calico, Cilium, Antrea, ...; flannel alone does not)."""
    pods = {"matchLabels": {LABEL: job.name}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(job),
            "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": pods}]}]}}


def _service(job: K8sJob) -> dict:
    """The pods' DNS names (<job>-<index>.<job>), there as soon as a pod has an address."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {LABEL: job.name}}}


def _indexed(pods: int, pod: dict, ttl: bool = True) -> dict:
    return {"completionMode": "Indexed", "completions": pods, "parallelism": pods, "backoffLimit": 0,
            **({"ttlSecondsAfterFinished": TTL_S} if ttl else {}), "template": pod}


def _indexed_job(job: K8sJob) -> dict:
    names = [f"{job.name}-{i}.{job.name}" for i in range(job.shape.nodes)]
    pod = _pod(job, _container(job, "kit", _task_command(job), _pod_env(job, names)), subdomain=job.name)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job),
            "spec": _indexed(job.shape.nodes, pod)}


def _jobset(job: K8sJob) -> dict:
    names = [f"{job.name}-node-0-{i}.{job.name}" for i in range(job.shape.nodes)]
    pod = _pod(job, _container(job, "kit", _task_command(job), _pod_env(job, names)))
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": _meta(job),
            "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "failurePolicy": {"maxRestarts": 0}, "ttlSecondsAfterFinished": TTL_S,
                     "replicatedJobs": [{"name": "node", "replicas": 1,
                                         "template": {"spec": _indexed(job.shape.nodes, pod, ttl=False)}}]}}


def _pytorchjob(job: K8sJob) -> dict:
    """Master and workers: the operator gives each pod PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and
    PET_MASTER_PORT, which torchrun reads; its container must be named pytorch."""
    s = job.shape
    pod = _pod(job, _container(job, "pytorch", _staged(_torchrun(job)), _torchrun_env(job)))
    specs = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": pod}}
    if s.nodes > 1:
        specs["Worker"] = {"replicas": s.nodes - 1, "restartPolicy": "Never", "template": pod}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _meta(job),
            "spec": {"nprocPerNode": str(s.nproc_per_node), "runPolicy": {"cleanPodPolicy": "Running",
                                                                          "backoffLimit": 0,
                                                                          "ttlSecondsAfterFinished": TTL_S},
                     "pytorchReplicaSpecs": specs}}


def _tfjob(job: K8sJob) -> dict:
    """One worker a pod; the operator writes each pod's TF_CONFIG (its container must be named tensorflow)."""
    container = _container(job, "tensorflow", _staged([IMAGE_PYTHON, "-u", RANK, job.script, *job.args]), [])
    container["ports"] = [{"name": "tfjob-port", "containerPort": 2222}]
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": _meta(job),
            "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0, "ttlSecondsAfterFinished": TTL_S},
                     "tfReplicaSpecs": {"Worker": {"replicas": job.shape.nodes, "restartPolicy": "Never",
                                                   "template": _pod(job, container)}}}}


def _mpijob(job: K8sJob) -> dict:
    """horovodrun on the launcher, over the operator's SSH to the workers' sshd. The operator's key pair is also the
    workers' host key, so the launcher pins it for the workers' names: host keys stay checked."""
    s = job.shape
    launcher = _container(job, "launcher", [IMAGE_PYTHON, "-I", POD, "mpi-launcher", str(s.ranks), job.name,
                                            job.script, *job.args], [], gpus=False)
    worker = _container(job, "worker", [IMAGE_PYTHON, "-I", POD, "mpi-worker"], [], capabilities=SSHD_CAPABILITIES)
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _meta(job),
            "spec": {"slotsPerWorker": s.tasks_per_node, "runPolicy": {"cleanPodPolicy": "Running",
                                                                       "backoffLimit": 0,
                                                                       "ttlSecondsAfterFinished": TTL_S},
                     "sshAuthMountPath": MPI_SSH, "mpiImplementation": "OpenMPI",
                     "launcherCreationPolicy": "WaitForWorkersReady",
                     "mpiReplicaSpecs": {
                         "Launcher": {"replicas": 1, "restartPolicy": "Never",
                                      "template": _pod(job, launcher, gpus=False)},
                         "Worker": {"replicas": s.nodes, "restartPolicy": "Never", "template": _pod(job, worker)}}}}


def _trainjob(job: K8sJob) -> dict:
    """On Kubeflow Trainer's torch-distributed runtime, which gives torchrun its PET_* variables; kit's volumes
    reach the runtime's `node` job and container through a runtime patch (Trainer 2.3's runtimePatches)."""
    s = job.shape
    container = _container(job, "node", _staged(_torchrun(job)), _torchrun_env(job))
    trainer = {"image": job.image, "command": container["command"], "numNodes": s.nodes,
               "numProcPerNode": s.nproc_per_node, "env": container["env"]}
    if "resources" in container:
        trainer["resourcesPerNode"] = container["resources"]
    spec = {"volumes": _volumes(job), "containers": [{"name": "node", "volumeMounts": container["volumeMounts"]}],
            **_pull(job)}
    node = {"name": "node", "template": {"spec": {"template": {"metadata": _pod_meta(job), "spec": spec}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": _meta(job),
            "spec": {"runtimeRef": {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                    "kind": "ClusterTrainingRuntime"},
                     "trainer": trainer,
                     "runtimePatches": [{"manager": "kit", "trainingRuntimeSpec": {
                         "template": {"spec": {"replicatedJobs": [node]}}}}]}}


# ------------------------------------------------------------------------------------------- pods and containers

def _pod(job: K8sJob, container: dict, subdomain: str | None = None, gpus: bool = True) -> dict:
    # No API token in the job's pods: job code is untrusted, and the namespace's default account may read Secrets
    # (another job's variables); nothing kit runs in a pod calls the API (MPIJob v2's launcher uses SSH).
    spec = {"restartPolicy": "Never", "automountServiceAccountToken": False}
    if subdomain:
        spec["subdomain"] = subdomain
    spec |= {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}, "containers": [container],
             "volumes": _volumes(job), **(_tolerations(job) if gpus else {}), **_pull(job)}
    return {"metadata": _pod_meta(job), "spec": spec}


def _tolerations(job: K8sJob) -> dict:
    """GPU nodes are commonly tainted nvidia.com/gpu (NoSchedule) to keep other pods off: a GPU job tolerates it."""
    return {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]} \
        if job.shape.gpus_per_node else {}


def _pod_meta(job: K8sJob) -> dict:
    """The label kit (and the job's Service) finds the job's pods by."""
    return {"labels": {LABEL: job.name}}


def _pull(job: K8sJob) -> dict:
    return {"imagePullSecrets": [{"name": job.pull_secret}]} if job.pull_secret else {}


def _volumes(job: K8sJob) -> list[dict]:
    items = [{"key": key, "path": path, "mode": 0o755 if executable else 0o644}
             for key, (path, (_, executable)) in _items(job)]
    workspace = ({"persistentVolumeClaim": {"claimName": job.workspace_pvc}} if job.workspace_pvc
                 else {"emptyDir": {}})
    # Docker's and the kubelet's 64 MB /dev/shm breaks NCCL and DataLoader workers: memory, half of what the pod may
    # use (what it holds counts against the pod's memory limit).
    shm = f"{max(memory_bytes(job.pod_memory) // 2 >> 20, 64)}Mi"
    return [{"name": "kit-files", "configMap": {"name": f"{job.name}-files", "items": items}},
            {"name": "workspace", **workspace},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}]


def _container(job: K8sJob, name: str, command: list[str], env: list[dict], gpus: bool = True,
               capabilities: list[str] = RANK_CAPABILITIES) -> dict:
    c = {"name": name, "image": job.image, "imagePullPolicy": "IfNotPresent", "workingDir": WORKSPACE,
         "command": command, "env": [*_variables(job), *env, {"name": "PYTHONUNBUFFERED", "value": "1"},
                                     {"name": "PYTHONFAULTHANDLER", "value": "1"},
                                     # where kit's task copies the job's files from into the workspace (none: a PVC)
                                     {"name": "KIT_STAGE", "value": "" if job.workspace_pvc else FILES},
                                     {"name": "KIT_WORKSPACE", "value": WORKSPACE}]}
    # Requests equal to limits (Kubernetes' Guaranteed class: whole CPUs are the pod's own under the static CPU
    # manager, and the pod is the last evicted); an MPIJob's launcher (gpus False) only runs horovodrun.
    amount = {"cpu": job.pod_cpus, "memory": job.pod_memory} if gpus else {"cpu": "1", "memory": "2Gi"}
    c["resources"] = {"requests": dict(amount), "limits": dict(amount)}
    if gpus and job.shape.gpus_per_node:
        c["resources"]["limits"]["nvidia.com/gpu"] = job.shape.gpus_per_node
        c["resources"]["requests"]["nvidia.com/gpu"] = job.shape.gpus_per_node
    c["securityContext"] = {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"], "add": list(capabilities)}}
    c["volumeMounts"] = [{"name": "kit-files", "mountPath": FILES, "readOnly": True},
                         {"name": "workspace", "mountPath": WORKSPACE}, {"name": "dshm", "mountPath": "/dev/shm"}]
    return c


def _variables(job: K8sJob) -> list[dict]:
    secret = set(job.secret_names)
    return [{"name": n, "valueFrom": {"secretKeyRef": {"name": job.secret_name, "key": n}}} if n in secret
            else {"name": n, "value": v} for n, v in job.variables]


def _task_command(job: K8sJob) -> list[str]:
    """An Indexed Job's or a JobSet's pod: kit's task starts the node's part of the job."""
    return [IMAGE_PYTHON, "-I", POD, "pod", job.launcher, job.script, *job.args]


def _pod_env(job: K8sJob, names: list[str]) -> list[dict]:
    s = job.shape
    env = {"KIT_JOB_ID": job.name, "KIT_POD_NAMES": " ".join(names), "KIT_TASKS_PER_NODE": str(s.tasks_per_node),
           "KIT_PORT": str(PORT), "KIT_RENDEZVOUS_PORT": str(RENDEZVOUS_PORT)}
    env |= {"KIT_HANG_TIMEOUT": f"{job.watched:g}"} if job.watched else {}
    if job.launcher == "torchrun":
        env |= {"KIT_NPROC_PER_NODE": str(s.nproc_per_node),
                "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": launch.TORCHRUN_PREFIX}
    return [{"name": k, "value": v} for k, v in env.items()]


def _staged(argv: list[str]) -> list[str]:
    """An operator's pod: kit's task copies the job's files into the workspace, then runs argv."""
    return [IMAGE_PYTHON, "-I", POD, "exec", *argv]


def _torchrun(job: K8sJob) -> list[str]:
    """torchrun with the operator's rendezvous (PET_* variables), every process kit's rank launcher."""
    return [IMAGE_PYTHON, "-m", "torch.distributed.run", f"--nproc-per-node={job.shape.nproc_per_node}", "--tee=3",
            "--no-python", IMAGE_PYTHON, "-u", RANK, job.script, *job.args]


def _torchrun_env(job: K8sJob) -> list[dict]:
    return [{"name": "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "value": launch.TORCHRUN_PREFIX}]
