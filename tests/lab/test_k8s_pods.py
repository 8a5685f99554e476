"""The pods of `kit export --to k8s` run the job. No Kubernetes API server can run on this machine, so the test does
what the kubelet, the Job controller and the MPI operator would do with the manifests kit wrote, on the real Docker
engine with the lab's cpu image (no image is built here):

- an Indexed Job: each index's pod a container: its ConfigMap volume laid out as the kubelet lays one out (the items'
  paths and modes behind a ..data link, the folder drwxrwxrwt) and mounted read-only, the emptyDir workspace,
  /dev/shm in memory of its sizeLimit, the container's securityContext (every capability dropped but those it adds,
  no privilege escalation) and memory limit, env from values and from a Secret the test makes, JOB_COMPLETION_INDEX, the hostname <job>-<i>
  and the headless Service's name <job>-<i>.<job> on a network of its own. Horovod's allreduce (two ranks a pod) and
  torchrun's (gloo, two processes a pod) run across the pods, every rank's line with kit's prefix; a rank that fails
  ends its pod with its code and stops its sibling, and the other pod, which the Job controller deletes (backoffLimit
  0), ends at SIGTERM; so does a pod deleted while it waits for the others. With --hang-timeout, a job whose rank 1
  waits on a collective the others never reach: each pod's watch says where its ranks are, with their stacks, and
  ends its pod; kit's reading of the pods' output names rank 1 and its pod.
- an MPIJob: the operator's P-521 key pair as its Secret volume at /root/.ssh, its hostfile at /etc/mpi, the workers
  then the launcher (WaitForWorkersReady): horovodrun over SSH with host keys checked, and refused where a worker
  answers with another host key.

The NetworkPolicy beside them is a network plugin's to enforce, and no plugin runs here: its rule is the unit tests'
(tests/unit/test_k8s.py).
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from helpers import run_kit
from kit.backends.k8s import jobs as k8sjobs
from kit.backends.k8s import podtask
from kit.cli.export import default_image

pytestmark = pytest.mark.lab

PODS = "kitlab-pods"        # every container, network and folder the module makes: leftovers are findable
RUN_S = 180                 # a job's pods, all together
GRACE_S = 30                # a deleted pod's terminationGracePeriodSeconds (Kubernetes' default)
SECRET_NAME = "WANDB_API_KEY"

# Each rank says what it got: the allreduce of rank + 1 over all ranks, its rank and size as its launcher set them,
# a digest of the Secret's value, whether the job's binary file reached it whole, and the pod it runs on.
REPORT = """\
secret = hashlib.sha256(os.environ.get("{secret}", "").encode()).hexdigest()[:16]
data = "ok" if open("data.bin", "rb").read() == bytes(range(256)) else "bad"
print("allreduce rank=%d size=%d env_rank=%s env_size=%s sum=%g secret=%s data=%s host=%s" % (
    rank, size, os.environ["{rank_var}"], os.environ["{size_var}"], total, secret, data, socket.gethostname()))
"""

HOROVOD_JOB = """\
import hashlib, os, socket, sys, time
import torch
import horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
if sys.argv[1:2] == ["--fail-rank"]:
    if rank == int(sys.argv[2]):
        print("rank %d fails" % rank, flush=True)
        sys.exit(3)
    print("rank %d waits" % rank, flush=True)
    time.sleep(300)
    print("rank %d was not stopped" % rank, flush=True)
    sys.exit(0)
total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()
""" + REPORT

TORCHRUN_JOB = """\
import hashlib, os, socket, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
total = t.item()
""" + REPORT + """\
# As examples/ddp_train.py ends: torch 2.13 over Gloo at times aborts a finished rank in the interpreter's teardown
# (SIGABRT, "terminate called without an active exception"), which torchrun reports as a failed job (seen here once).
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""

LINE = re.compile(r"^\[(\d+)\]<stdout>:allreduce rank=(\d+) size=(\d+) env_rank=(\d+) env_size=(\d+) sum=(\S+) "
                  r"secret=(\w+) data=(\w+) host=(\S+)$", re.M)


# ----------------------------------------------------------------------------------------------- the kubelet's part

def payload(source: dict) -> dict[str, bytes]:
    """A ConfigMap's or a Secret's keys and their bytes."""
    if source["kind"] == "Secret":
        return {k: base64.b64decode(v) for k, v in source.get("data", {}).items()}
    return {**{k: v.encode() for k, v in source.get("data", {}).items()},
            **{k: base64.b64decode(v) for k, v in source.get("binaryData", {}).items()}}


def projected_volume(folder: Path, source: dict, volume: dict) -> Path:
    """A ConfigMap or Secret volume as the kubelet's atomic writer lays it out: the items (key -> path, mode) in a
    timestamped ..folder, ..data a link to it, each top-level entry a link through ..data, and the volume's own
    folder world-writable with the sticky bit (drwxrwxrwt, as kubelets make it: kubernetes/kubernetes#125876)."""
    ref = volume.get("configMap") or volume["secret"]
    assert ref.get("name", ref.get("secretName")) == source["metadata"]["name"]
    keys, stamp, tops = payload(source), folder / time.strftime("..%Y_%m_%d_%H_%M_%S.000000001"), set()
    for item in ref.get("items") or [{"key": k, "path": k} for k in keys]:
        path = stamp / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(keys[item["key"]])  # a key the object lacks: the kubelet would not start the pod
        path.chmod(item.get("mode", ref.get("defaultMode", 0o644)))
        tops.add(item["path"].split("/")[0])
    (folder / "..data").symlink_to(stamp.name)
    for top in tops:
        (folder / top).symlink_to(f"..data/{top}")
    folder.chmod(0o1777)
    return folder


def expand(text: str, env: dict) -> str:
    """The kubelet's $(VAR) references in command and args ($$ an escaped $)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def pod_env(container: dict, objects: dict) -> dict:
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]  # anything else the emulation does not know: KeyError, a failure
            env[var["name"]] = payload(objects[ref["name"]])[ref["key"]].decode()
    return env


# ------------------------------------------------------------------------------------------- the MPI operator's part
# As kubeflow/mpi-operator v2beta1 (pkg/controller/mpi_job_controller.go) makes an MPIJob's objects and pods.

NAMESPACE = "default"


def operator_ssh_secret(job: str) -> dict:
    """newSSHAuthSecret: an ECDSA P-521 key, its private half as PEM (EC PRIVATE KEY), its public half in
    authorized_keys form."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert private.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth", "metadata": {"name": f"{job}-ssh"},
            "data": {"ssh-privatekey": base64.b64encode(private).decode(),
                     "ssh-publickey": base64.b64encode(public + b"\n").decode()}}


def operator_config(job: str, workers: int, slots: int) -> dict:
    """newConfigMap (OpenMPI's hostfile) and discover_hosts.sh, every worker running."""
    names = [f"{job}-worker-{i}.{job}-worker.{NAMESPACE}.svc" for i in range(workers)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{job}-config"},
            "data": {"hostfile": "".join(f"{n} slots={slots}\n" for n in names),
                     "discover_hosts.sh": "#!/bin/sh\n" + "".join(f"echo {n}\n" for n in names)}}


def operator_pod(job: str, spec: dict, role: str, mount_path: str, slots: int) -> dict:
    """newWorker / newLauncherPodTemplate: the replica's pod with the operator's variables and volumes added."""
    pod = yaml.safe_load(yaml.safe_dump(spec["template"]["spec"]))  # a deep copy
    (container,) = pod["containers"]
    container["env"] = container.get("env", []) + [{"name": "K_MPI_JOB_ROLE", "value": role}]
    if role == "launcher":
        container["env"] += [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
                             {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
                             {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
                             {"name": "OMPI_MCA_orte_set_default_slots", "value": str(slots)},
                             {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
                             {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": ""}]
        pod["volumes"].append({"name": "mpi-job-config", "configMap": {"name": f"{job}-config", "items": [
            {"key": "hostfile", "path": "hostfile", "mode": 0o444},
            {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555}]}})
        container["volumeMounts"].append({"name": "mpi-job-config", "mountPath": "/etc/mpi"})
    secret = {"secretName": f"{job}-ssh", "items": [{"key": "ssh-privatekey", "path": "id_rsa"},
                                                      {"key": "ssh-publickey", "path": "id_rsa.pub"},
                                                      {"key": "ssh-publickey", "path": "authorized_keys"}]}
    if mount_path == "/root/.ssh":
        secret["defaultMode"] = 0o600
    pod["volumes"].append({"name": "ssh-auth", "secret": secret})
    container["volumeMounts"].append({"name": "ssh-auth", "mountPath": mount_path})
    return pod


class Pods:
    """The containers, network and folders of one job's pods; remove() takes all of them away."""

    def __init__(self, client, case: str) -> None:
        self.client, self.case = client, case
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PODS}-{case}-"))
        self.network = client.networks.create(f"{PODS}-{case}", driver="bridge", labels={PODS: case})
        self.containers: list = []

    def start(self, objects: list[dict], image: str, secret: dict, indexes: list[int] | None = None) -> list:
        """An Indexed Job's pods (those of `indexes`, else all), started together as the scheduler would."""
        configmap = next(o for o in objects if o["kind"] == "ConfigMap")
        service = next(o for o in objects if o["kind"] == "Service")
        job = next(o for o in objects if o["kind"] == "Job")
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
        assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
        assert pod["containers"][0]["image"] == image
        name, sources = job["metadata"]["name"], {o["metadata"]["name"]: o for o in (configmap, secret)}
        for index in range(spec["completions"]) if indexes is None else indexes:
            hostname = f"{name}-{index}"
            self.containers.append(self.pod(str(index), hostname, [f"{hostname}.{pod['subdomain']}"], pod, sources,
                                            {"JOB_COMPLETION_INDEX": str(index)}))
        for c in self.containers:
            c.start()
        return self.containers

    def pod(self, label: str, hostname: str, aliases: list[str], pod: dict, sources: dict, extra_env: dict):
        """One pod's container, made (not started) as the kubelet would run the pod spec's first container."""
        (container,) = pod["containers"]
        volumes, binds, shm = {v["name"]: v for v in pod["volumes"]}, {}, None
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            read_only = mount.get("readOnly", False)
            if "configMap" in volume or "secret" in volume:
                ref = volume.get("configMap") or volume["secret"]
                source = projected_volume(self._new(f"{label}-{mount['name']}"), sources[ref.get(
                    "name", ref.get("secretName"))], volume)
                read_only = read_only or "secret" in volume  # the kubelet mounts a Secret read-only
            elif volume.get("emptyDir", {}).get("medium") == "Memory" and mount["mountPath"] == "/dev/shm":
                shm = volume["emptyDir"]["sizeLimit"].replace("Mi", "m").replace("Gi", "g")
                continue
            else:
                assert volume["emptyDir"] == {}, volume
                source = self._new(f"{label}-{mount['name']}")
                source.chmod(0o777)  # as the kubelet makes an emptyDir
            binds[str(source)] = {"bind": mount["mountPath"], "mode": "ro" if read_only else "rw"}
        env = {**pod_env(container, sources), **extra_env}
        command = [expand(a, env) for a in container["command"] + container.get("args", [])]
        api = self.client.api
        # The container's securityContext as the kubelet gives it to the runtime: root with only the capabilities it
        # adds, no privilege escalation (no_new_privs), the runtime's default seccomp profile (Docker's own); its
        # memory limit (its CPUs are more than this machine has: not applied)
        security = container["securityContext"]
        assert security["capabilities"]["drop"] == ["ALL"] and security["allowPrivilegeEscalation"] is False
        assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        limits = container["resources"]["limits"]
        confined = dict(cap_drop=["ALL"], cap_add=security["capabilities"]["add"],
                        security_opt=["no-new-privileges:true"], mem_limit=limits["memory"].replace("Gi", "g"))
        made = api.create_container(
            container["image"], command=command[1:], entrypoint=command[:1], hostname=hostname,
            working_dir=container.get("workingDir"), environment=env, name=f"{PODS}-{self.case}-{label}",
            labels={PODS: self.case},
            host_config=api.create_host_config(binds=binds, shm_size=shm, network_mode=self.network.name, **confined),
            networking_config=api.create_networking_config(
                {self.network.name: api.create_endpoint_config(aliases=aliases)}))
        return self.client.containers.get(made["Id"])

    def mpijob(self, objects: list[dict], image: str, secret: dict, impostor: int | None = None) -> dict:
        """The MPI operator's run of an MPIJob: the workers, then (WaitForWorkersReady) the launcher; once the
        launcher ends, the workers still running are deleted (cleanPodPolicy Running). Bounded by RUN_S. Worker
        `impostor` (if given) serves another host key, and admits the operator's key all the same."""
        (mpijob,) = [o for o in objects if o["kind"] == "MPIJob"]
        job, spec = mpijob["metadata"]["name"], mpijob["spec"]
        assert spec["mpiImplementation"] == "OpenMPI" and spec["launcherCreationPolicy"] == "WaitForWorkersReady"
        replicas, slots, mount = spec["mpiReplicaSpecs"], spec["slotsPerWorker"], spec["sshAuthMountPath"]
        sources = {o["metadata"]["name"]: o for o in [*objects, secret, operator_ssh_secret(job),
                                                      operator_config(job, replicas["Worker"]["replicas"], slots)]}
        service = f"{job}-worker"  # the workers' headless Service, also the launcher's subdomain
        workers = []
        for i in range(replicas["Worker"]["replicas"]):
            name = f"{job}-worker-{i}"
            pod = operator_pod(job, replicas["Worker"], "worker", mount, slots)
            own = sources
            if i == impostor:
                other = operator_ssh_secret(job)["data"]["ssh-privatekey"]
                own = {**sources, f"{job}-ssh": yaml.safe_load(yaml.safe_dump(sources[f"{job}-ssh"]))}
                own[f"{job}-ssh"]["data"]["ssh-privatekey"] = other
            workers.append(self.pod(f"worker-{i}", name, [f"{name}.{service}", f"{name}.{service}.{NAMESPACE}.svc"],
                                    pod, own, {}))
        self.containers += workers
        deadline = time.monotonic() + RUN_S
        for w in workers:
            w.start()
        for w in workers:  # no readiness probe: a pod is ready once its container runs
            while w.reload() or w.status != "running":
                assert w.status == "created" and time.monotonic() < deadline, w.logs().decode(errors="replace")
                time.sleep(0.2)
        pod = operator_pod(job, replicas["Launcher"], "launcher", mount, slots)
        name = f"{job}-launcher"
        launcher = self.pod("launcher", name, [f"{name}.{service}", f"{name}.{service}.{NAMESPACE}.svc"], pod,
                            sources, {})
        self.containers.append(launcher)
        launcher.start()
        while launcher.reload() or launcher.status != "exited":
            if time.monotonic() > deadline:
                launcher.stop(timeout=GRACE_S)
                break
            time.sleep(0.5)
        launcher.reload()
        ends = {"launcher": {"code": launcher.attrs["State"]["ExitCode"], "deleted": time.monotonic() > deadline,
                             "stdout": launcher.logs(stdout=True, stderr=False).decode(errors="replace"),
                             "stderr": launcher.logs(stdout=False, stderr=True).decode(errors="replace")}}
        for i, w in enumerate(workers):
            started = time.monotonic()
            w.stop(timeout=GRACE_S)
            w.reload()
            ends[f"worker-{i}"] = {"code": w.attrs["State"]["ExitCode"], "seconds": time.monotonic() - started,
                                   "killed": w.attrs["State"]["ExitCode"] == 137,
                                   "stdout": w.logs(stdout=True, stderr=False).decode(errors="replace"),
                                   "stderr": w.logs(stdout=False, stderr=True).decode(errors="replace")}
        return ends

    def _new(self, name: str) -> Path:
        path = self.folder / name
        path.mkdir()
        return path

    def wait(self) -> list[dict]:
        """Every pod's end, as the Job controller sees it with backoffLimit 0: once one pod fails, the others are
        deleted (SIGTERM, then SIGKILL after the grace period). Bounded by RUN_S."""
        deadline, ends = time.monotonic() + RUN_S, {}
        while len(ends) < len(self.containers) and time.monotonic() < deadline:
            for i, c in enumerate(self.containers):
                c.reload()
                if i not in ends and c.status == "exited":
                    ends[i] = {"code": c.attrs["State"]["ExitCode"], "deleted": False}
            if any(e["code"] for e in ends.values()):
                break
            time.sleep(0.5)
        for i, c in enumerate(self.containers):
            c.reload()
            if i not in ends and c.status == "exited":
                ends[i] = {"code": c.attrs["State"]["ExitCode"], "deleted": False}
            elif i not in ends:
                started = time.monotonic()
                c.stop(timeout=GRACE_S)
                c.reload()
                ends[i] = {"code": c.attrs["State"]["ExitCode"], "deleted": True,
                           "seconds": time.monotonic() - started, "killed": c.attrs["State"]["ExitCode"] == 137}
        for i, c in enumerate(self.containers):
            ends[i]["stdout"] = c.logs(stdout=True, stderr=False).decode(errors="replace")
            ends[i]["stderr"] = c.logs(stdout=False, stderr=True).decode(errors="replace")
        return [ends[i] for i in range(len(self.containers))]

    def remove(self) -> None:
        for c in self.client.containers.list(all=True, filters={"label": f"{PODS}={self.case}"}):
            c.remove(force=True)
        self.network.remove()
        shutil.rmtree(self.folder, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def image(project, client) -> str:
    """The lab's cpu image (built once for the whole lab by the project fixture)."""
    return default_image(client, project / "kit.yaml")


def remove_leftovers(client) -> None:
    """What a killed run of this module left (containers first: a network in use cannot go)."""
    for c in client.containers.list(all=True, filters={"label": PODS}):
        c.remove(force=True)
    for n in client.networks.list(filters={"label": PODS}):
        n.remove()


@pytest.fixture
def pods(client):
    remove_leftovers(client)
    made = []

    def make(case: str) -> Pods:
        made.append(Pods(client, case))
        return made[-1]

    yield make
    for p in made:
        p.remove()
    assert not client.containers.list(all=True, filters={"label": PODS})
    assert not client.networks.list(filters={"label": PODS})


def export(folder: Path, image: str, launcher: str, script: str, *flags: str, kind: str = "indexed-job",
           args: tuple = ()) -> tuple[list, dict, str]:
    """Writes the job's folder and runs kit export --to k8s: its objects, the Secret a user would make for its
    variables, and the secret value."""
    folder.mkdir()
    rank_var, size_var = ("HOROVOD_RANK", "HOROVOD_SIZE") if launcher == "horovod" else ("RANK", "WORLD_SIZE")
    script_name = "train.py"
    (folder / script_name).write_text(script.format(secret=SECRET_NAME, rank_var=rank_var, size_var=size_var))
    (folder / "data.bin").write_bytes(bytes(range(256)))  # not UTF-8: the ConfigMap's binaryData
    value = secrets.token_hex(16)
    r = run_kit("export", "--to", "k8s", "--kind", kind, "--launcher", launcher, "--image", image,
                "-e", f"{SECRET_NAME}={value}", "-e", "OMP_NUM_THREADS=1", *flags, "train.py", *args, cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert value not in r.stdout and value not in r.stderr
    objects = list(yaml.safe_load_all(r.stdout))
    assert [o["kind"] for o in objects] == {"indexed-job": ["ConfigMap", "NetworkPolicy", "Service", "Job"],
                                            "mpijob": ["ConfigMap", "NetworkPolicy", "MPIJob"]}[kind]
    assert "data.bin" in str(objects[-1]) and objects[0]["binaryData"]
    made = re.search(r"kubectl create secret generic (\S+) ", r.stderr)  # the Secret as kit says to make it
    assert made and made[1] == f"kit-{Path(script_name).stem}-env", r.stderr
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": made[1]},
              "data": {SECRET_NAME: base64.b64encode(value.encode()).decode()}}
    return objects, secret, value


def show(ends: list[dict]) -> str:
    return "\n".join(f"--- pod {i}: exit {e['code']}\n{e['stdout'][-3000:]}\n{e['stderr'][-3000:]}"
                     for i, e in enumerate(ends))


def check_lines(text: str, ranks: int, secret: str, host_of, context: str) -> None:
    """Every rank's line, with kit's prefix: the allreduce's sum, its rank and size as the launcher set them, the
    secret's digest, the job's binary file, and the pod it ran on (host_of(rank))."""
    digest, seen = hashlib.sha256(secret.encode()).hexdigest()[:16], set()
    for prefix, rank, size, env_rank, env_size, total, got, data, host in LINE.findall(text):
        assert prefix == rank == env_rank and int(size) == int(env_size) == ranks, context
        assert float(total) == ranks * (ranks + 1) / 2, context
        assert got == digest and data == "ok", context
        assert host == host_of(int(rank)), context
        seen.add(int(rank))
    assert sorted(seen) == list(range(ranks)), context


def check_allreduce(ends: list[dict], job: str, ranks: int, per_pod: int, secret: str) -> None:
    assert [e["code"] for e in ends] == [0] * len(ends), show(ends)
    assert not any(e["deleted"] for e in ends), show(ends)
    text = "".join(e["stdout"] for e in ends)
    check_lines(text, ranks, secret, lambda r: f"{job}-{r // per_pod}", show(ends))
    for index, e in enumerate(ends):  # each rank's line is in the log of the pod it ran on
        ranks_here = {int(m[0]) for m in LINE.findall(e["stdout"])}
        assert ranks_here == set(range(index * per_pod, (index + 1) * per_pod)), show(ends)


def test_horovod_pods_allreduce_two_ranks_a_pod(tmp_path, image, pods):
    objects, secret, value = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4")
    job = objects[2]["metadata"]["name"]
    p = pods("hvd")
    started = time.monotonic()
    p.start(objects, image, secret)
    ends = p.wait()
    print(f"horovod, 2 pods x 2 ranks: {time.monotonic() - started:.1f} s\n{show(ends)}")
    check_allreduce(ends, job, 4, 2, value)


def test_torchrun_pods_allreduce_two_processes_a_pod(tmp_path, image, pods):
    objects, secret, value = export(tmp_path / "job", image, "torchrun", TORCHRUN_JOB, "--nodes", "2",
                                    "--ntasks-per-node", "2")
    job = objects[2]["metadata"]["name"]
    p = pods("ddp")
    started = time.monotonic()
    p.start(objects, image, secret)
    ends = p.wait()
    print(f"torchrun, 2 pods x 2 processes: {time.monotonic() - started:.1f} s\n{show(ends)}")
    check_allreduce(ends, job, 4, 2, value)


def test_a_failed_rank_ends_its_pod_with_its_code_and_no_pod_hangs(tmp_path, image, pods):
    objects, secret, _ = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4",
                                args=("--fail-rank", "1"))
    p = pods("fail")
    started = time.monotonic()
    p.start(objects, image, secret)
    ends = p.wait()
    print(f"horovod, rank 1 fails: {time.monotonic() - started:.1f} s\n{show(ends)}")
    first, other = ends
    assert first["code"] == 3 and not first["deleted"], show(ends)   # ended by itself, with the rank's code
    assert "[1]<stdout>:rank 1 fails" in first["stdout"], show(ends)
    assert "[0]<stdout>:rank 0 waits" in first["stdout"], show(ends)  # its sibling was running, and was stopped:
    assert "was not stopped" not in first["stdout"] + other["stdout"], show(ends)
    assert time.monotonic() - started < RUN_S
    # The other pod's ranks would sleep on; the Job controller deletes it, and it ends on SIGTERM, not SIGKILL.
    assert other["code"] != 0 and not other.get("killed"), show(ends)
    if other["deleted"]:
        assert other["seconds"] < GRACE_S, show(ends)


def test_a_pod_deleted_while_it_waits_for_the_others_ends_on_sigterm(tmp_path, image, pods):
    """Pod 1 alone (pod 0 not scheduled): it waits for pod 0's name to resolve; deleted, it must end at SIGTERM, as
    the container's PID 1 (which the kernel spares every signal it has no handler for), not at SIGKILL."""
    objects, secret, _ = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4")
    p = pods("alone")
    (pod,) = p.start(objects, image, secret, indexes=[1])
    time.sleep(3)
    pod.reload()
    assert pod.status == "running", pod.logs().decode(errors="replace")
    started = time.monotonic()
    pod.stop(timeout=GRACE_S)
    seconds = time.monotonic() - started
    pod.reload()
    code = pod.attrs["State"]["ExitCode"]
    print(f"pod 1 alone, deleted: exit {code} after {seconds:.1f} s")
    assert code == 143 and seconds < 5, (code, seconds, pod.logs().decode(errors="replace"))


def test_mpijob_launcher_and_workers_allreduce_over_the_operators_ssh_with_host_keys_checked(tmp_path, image, pods):
    """The MPIJob's launcher runs horovodrun over the operator's SSH (its P-521 key, the workers' names from its
    hostfile) to the workers' sshd: host keys checked (the image's Horovod and kit's ssh config say
    StrictHostKeyChecking yes), every rank's line with horovodrun's prefix on the launcher."""
    objects, secret, value = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4",
                                    kind="mpijob")
    job = objects[-1]["metadata"]["name"]
    p = pods("mpi")
    started = time.monotonic()
    ends = p.mpijob(objects, image, secret)
    context = "\n".join(f"--- {k}: exit {e['code']}\n{e['stdout'][-4000:]}\n{e['stderr'][-4000:]}"
                        for k, e in ends.items())
    print(f"mpijob, 2 workers x 2 slots: {time.monotonic() - started:.1f} s\n{context}")
    assert ends["launcher"]["code"] == 0 and not ends["launcher"]["deleted"], context
    check_lines(ends["launcher"]["stdout"], 4, value, lambda r: f"{job}-worker-{r // 2}", context)
    assert not any(e["killed"] for k, e in ends.items() if k != "launcher"), context  # sshd ends at SIGTERM


def test_mpijob_launcher_refuses_a_worker_with_another_host_key(tmp_path, image, pods):
    """Worker 1 admits the operator's key but answers with a host key of its own (an impostor on its name): the
    launcher's SSH refuses it, and no rank runs."""
    objects, secret, _ = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4",
                                kind="mpijob")
    job = objects[-1]["metadata"]["name"]
    ends = pods("impostor").mpijob(objects, image, secret, impostor=1)
    context = "\n".join(f"--- {k}: exit {e['code']}\n{e['stdout'][-4000:]}\n{e['stderr'][-4000:]}"
                        for k, e in ends.items())
    print(f"mpijob, worker 1 an impostor:\n{context}")
    launcher = ends["launcher"]["stdout"] + ends["launcher"]["stderr"]
    assert ends["launcher"]["code"] != 0 and not ends["launcher"]["deleted"], context
    assert "Host key verification failed" in launcher, context
    assert f"ssh not successful for host {job}-worker-1." in launcher, context
    assert f"ssh not successful for host {job}-worker-0." not in launcher, context
    assert not LINE.findall(ends["launcher"]["stdout"]), context
    assert "Accepted publickey" not in ends["worker-1"]["stderr"], context  # no login reached the impostor


# Rank 1 waits on a broadcast the others never reach, the others on an allreduce rank 1 never reaches (as
# tests/lab/test_slurm.py's HUNG): each waits for the others for good.
HUNG = """import os, sys, time
import torch
import horovod.torch as hvd
hvd.init()
print("waits", hvd.rank(), flush=True)
if hvd.rank() == 1:
    hvd.broadcast(torch.ones(4), root_rank=0, name="params")
else:
    hvd.allreduce(torch.ones(4), name="grads")
print("never", flush=True)
"""


def test_a_hung_job_is_named_with_every_ranks_stack_by_its_pods_watch(tmp_path, image, pods):
    """Three pods, a rank each, --hang-timeout 60s: within the timeout and a few seconds of the ranks' last move each
    pod prints where its rank is and its stack (faulthandler's, on SIGUSR2), ends it, waits for the others' to have
    said theirs (podtask.SETTLE_S) and exits HUNG_EXIT, and the Job controller deletes the rest; read as `kit run
    --on k8s` reads the pods' output (k8sjobs.pod_line), the report names rank 1 and its pod at its line, the other
    two ranks at theirs, with every rank's stack."""
    objects, secret, _ = export(tmp_path / "job", image, "horovod", HUNG, "--nodes", "3", "--np", "3",
                                "--hang-timeout", "60s")
    job = objects[-1]["metadata"]["name"]
    env = {e["name"]: e.get("value") for e in objects[-1]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KIT_HANG_TIMEOUT"] == "60"
    p = pods("hung")
    started = time.monotonic()
    p.start(objects, image, secret)
    ends = p.wait()
    took = time.monotonic() - started
    print(f"horovod, 3 pods, rank 1 hung: {took:.1f} s\n{show(ends)}")
    assert [e["code"] for e in ends] == [podtask.HUNG_EXIT] * 3, show(ends)
    assert not any(e.get("killed") for e in ends), show(ends)  # (one deleted while it waited ends at SIGTERM)
    for index, e in enumerate(ends):
        assert f"[{index}]<stdout>:waits {index}" in e["stdout"] and "never" not in e["stdout"], show(ends)
        verdict = re.findall(r"^@@kit-hung (\d+)$", e["stdout"], re.M)
        assert len(verdict) == 1 and 60 <= int(verdict[0]) < 60 + 10, show(ends)  # each pod came to it by itself
    hangs, shown = k8sjobs.Hangs(3), []
    for index, e in enumerate(ends):
        for line in e["stdout"].splitlines():
            k8sjobs.pod_line(f"{job}-{index}", line, lambda *a: shown.append(a), hangs)
    assert not any(text.startswith("@@kit-hang") for _, _, text in shown)  # kit's lines are not output
    said = hangs.report()
    print(said)
    named = re.fullmatch(r"no rank has made progress for (\d+) s: rank 1 on (\S+) is at (.*); the other 2 ranks wait "
                         r"at (.*)", said)
    assert named and named[2] == f"{job}-1", said
    assert "train.py:7 in <module>" in named[3] and "train.py:9 in <module>" in named[4], said
    stacks = hangs.stacks()
    for rank in range(3):
        pod, text = stacks[rank]
        assert pod == f"{job}-{rank}" and "most recent call first" in text, (rank, text)
        assert ('train.py", line 7' if rank == 1 else 'train.py", line 9') in text, (rank, text)
    assert took < RUN_S
