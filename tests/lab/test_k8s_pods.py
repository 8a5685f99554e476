"""The pods of `kit export --to k8s --kind indexed-job` run the job: no Kubernetes API server can run on this machine,
so the test does what the kubelet and the Job controller would do with the manifests kit wrote, on the real Docker
engine with kit's cpu image: each index's pod a container (its ConfigMap volume made as the kubelet makes one, with
its items' paths and modes behind a ..data link, mounted read-only; the emptyDir workspace; /dev/shm in memory; env
from values and from a Secret the test makes; JOB_COMPLETION_INDEX; the hostname <job>-<i> and the headless Service's
name <job>-<i>.<job> on a network of its own). Horovod's allreduce and torchrun's (gloo) then run across the pods,
with kit's per-rank prefixes; a rank that fails ends its pod with its code and stops its sibling ranks, and the
Job's other pod (which the Job controller deletes, backoffLimit 0) ends on SIGTERM instead of hanging."""

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
from kit.cli.export import default_image

pytestmark = pytest.mark.lab

PREFIX = "kitlab-pods"      # every container, network and folder the module makes: leftovers are findable
RUN_S = 180                 # a job's pods, all together
GRACE_S = 30                # a deleted pod's terminationGracePeriodSeconds (Kubernetes' default)
SECRET_NAME = "WANDB_API_KEY"

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
""" + """\
secret = hashlib.sha256(os.environ.get("{secret}", "").encode()).hexdigest()[:16]
data = "ok" if open("data.bin", "rb").read() == bytes(range(256)) else "bad"
print("allreduce rank=%d size=%d env_rank=%s env_size=%s sum=%g secret=%s data=%s host=%s" % (
    rank, size, os.environ["{rank_var}"], os.environ["{size_var}"], total, secret, data, socket.gethostname()))
"""

TORCHRUN_JOB = """\
import hashlib, os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
total = t.item()
""" + HOROVOD_JOB.split('total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()\n')[1]

LINE = re.compile(r"^\[(\d+)\]<stdout>:allreduce rank=(\d+) size=(\d+) env_rank=(\d+) env_size=(\d+) sum=(\S+) "
                  r"secret=(\w+) data=(\w+) host=(\S+)$", re.M)


# ----------------------------------------------------------------------------------------------- the kubelet's part

def configmap_volume(folder: Path, configmap: dict, volume: dict) -> Path:
    """The ConfigMap volume as the kubelet's atomic writer lays it out: the items (key -> path, mode) in a timestamped
    ..folder, ..data a link to it, and each top-level entry a link through ..data."""
    cm = volume["configMap"]
    assert cm["name"] == configmap["metadata"]["name"]
    payload = {**{k: v.encode() for k, v in configmap.get("data", {}).items()},
               **{k: base64.b64decode(v) for k, v in configmap.get("binaryData", {}).items()}}
    stamp = folder / time.strftime("..%Y_%m_%d_%H_%M_%S.000000001")
    tops = set()
    for item in cm["items"]:
        path = stamp / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload[item["key"]])  # a key the ConfigMap lacks: the kubelet would not start the pod
        path.chmod(item.get("mode", cm.get("defaultMode", 0o644)))
        tops.add(item["path"].split("/")[0])
    (folder / "..data").symlink_to(stamp.name)
    for top in tops:
        (folder / top).symlink_to(f"..data/{top}")
    return folder


def expand(text: str, env: dict) -> str:
    """The kubelet's $(VAR) references in command and args ($$ an escaped $)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def pod_env(container: dict, secret: dict, index: int) -> dict:
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]  # anything else the emulation does not know: KeyError, a failure
            assert ref["name"] == secret["metadata"]["name"], ref
            env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return {**env, "JOB_COMPLETION_INDEX": str(index)}


class Pods:
    """The containers, network and folders of one job's pods; remove() takes all of them away."""

    def __init__(self, client, case: str) -> None:
        self.client, self.case = client, case
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{case}-"))
        self.network = client.networks.create(f"{PREFIX}-{case}", driver="bridge", labels={PREFIX: case})
        self.containers: list = []

    def start(self, objects: list[dict], image: str, secret: dict, indexes: list[int] | None = None) -> list:
        configmap = next(o for o in objects if o["kind"] == "ConfigMap")
        service = next(o for o in objects if o["kind"] == "Service")
        job = next(o for o in objects if o["kind"] == "Job")
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
        assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
        (container,) = pod["containers"]
        assert container["image"] == image
        for index in range(spec["completions"]) if indexes is None else indexes:
            self.containers.append(self._pod(job["metadata"]["name"], pod, container, configmap, secret, index))
        for c in self.containers:  # the scheduler starts them together
            c.start()
        return self.containers

    def _pod(self, job: str, pod: dict, container: dict, configmap: dict, secret: dict, index: int):
        volumes, binds, shm = {v["name"]: v for v in pod["volumes"]}, {}, None
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                source = configmap_volume(self._new(f"{index}-{mount['name']}"), configmap, volume)
            elif volume.get("emptyDir", {}).get("medium") == "Memory" and mount["mountPath"] == "/dev/shm":
                shm = "1g"
                continue
            else:
                assert volume["emptyDir"] == {}, volume
                source = self._new(f"{index}-{mount['name']}")
                source.chmod(0o777)  # as the kubelet makes an emptyDir
            binds[str(source)] = {"bind": mount["mountPath"], "mode": "ro" if mount.get("readOnly") else "rw"}
        env = pod_env(container, secret, index)
        command = [expand(a, env) for a in container["command"] + container.get("args", [])]
        api, name = self.client.api, f"{job}-{index}"
        made = api.create_container(
            container["image"], command=command[1:], entrypoint=command[:1], hostname=name,
            working_dir=container.get("workingDir"), environment=env, name=f"{PREFIX}-{self.case}-{index}",
            labels={PREFIX: self.case},
            host_config=api.create_host_config(binds=binds, shm_size=shm, network_mode=self.network.name),
            networking_config=api.create_networking_config(
                {self.network.name: api.create_endpoint_config(aliases=[f"{name}.{pod['subdomain']}"])}))
        return self.client.containers.get(made["Id"])

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
        for c in self.client.containers.list(all=True, filters={"label": f"{PREFIX}={self.case}"}):
            c.remove(force=True)
        self.network.remove()
        shutil.rmtree(self.folder, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def image(project, client) -> str:
    """The lab's cpu image (built once for the whole lab by the project fixture)."""
    return default_image(client, project / "kit.yaml")


@pytest.fixture
def pods(client):
    made = []

    def make(case: str) -> Pods:
        made.append(Pods(client, case))
        return made[-1]

    yield make
    for p in made:
        p.remove()
    assert not client.containers.list(all=True, filters={"label": PREFIX})
    assert not client.networks.list(filters={"label": PREFIX})


def export(folder: Path, image: str, launcher: str, script: str, *flags: str, args: tuple = ()) -> tuple[list, dict]:
    """Writes the job's folder, runs kit export --to k8s, and returns its objects and the Secret a user would make."""
    folder.mkdir()
    rank_var, size_var = ("HOROVOD_RANK", "HOROVOD_SIZE") if launcher == "horovod" else ("RANK", "WORLD_SIZE")
    (folder / "train.py").write_text(script.format(secret=SECRET_NAME, rank_var=rank_var, size_var=size_var))
    (folder / "data.bin").write_bytes(bytes(range(256)))  # not UTF-8: the ConfigMap's binaryData
    value = secrets.token_hex(16)
    r = run_kit("export", "--to", "k8s", "--kind", "indexed-job", "--launcher", launcher, "--image", image,
                "-e", f"{SECRET_NAME}={value}", "-e", "OMP_NUM_THREADS=1", *flags, "train.py", *args, cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert value not in r.stdout and value not in r.stderr
    objects = list(yaml.safe_load_all(r.stdout))
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "Job"]
    assert "data.bin" in str(objects[2]) and objects[0]["binaryData"]
    name = objects[2]["metadata"]["name"]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-env"},
              "data": {SECRET_NAME: base64.b64encode(value.encode()).decode()}}
    return objects, secret | {"value": value}


def show(ends: list[dict]) -> str:
    return "\n".join(f"--- pod {i}: exit {e['code']}\n{e['stdout'][-3000:]}\n{e['stderr'][-3000:]}"
                     for i, e in enumerate(ends))


def check_allreduce(ends: list[dict], job: str, ranks: int, per_pod: int, secret: str) -> None:
    assert [e["code"] for e in ends] == [0] * len(ends), show(ends)
    assert not any(e["deleted"] for e in ends), show(ends)
    digest = hashlib.sha256(secret.encode()).hexdigest()[:16]
    seen = {}
    for index, e in enumerate(ends):
        for prefix, rank, size, env_rank, env_size, total, got, data, host in LINE.findall(e["stdout"]):
            assert prefix == rank == env_rank and int(size) == int(env_size) == ranks, show(ends)
            assert float(total) == ranks * (ranks + 1) / 2, show(ends)
            assert got == digest and data == "ok", show(ends)
            assert host == f"{job}-{index}" and int(rank) // per_pod == index, show(ends)  # the rank ran on its pod
            seen[int(rank)] = index
    assert sorted(seen) == list(range(ranks)), show(ends)


def test_horovod_pods_allreduce_two_ranks_a_pod(tmp_path, image, pods):
    objects, secret = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4")
    job = objects[2]["metadata"]["name"]
    p = pods("hvd")
    started = time.monotonic()
    p.start(objects, image, secret)
    ends = p.wait()
    print(f"horovod, 2 pods x 2 ranks: {time.monotonic() - started:.1f} s\n{show(ends)}")
    check_allreduce(ends, job, 4, 2, secret["value"])


def test_torchrun_pods_allreduce_two_processes_a_pod(tmp_path, image, pods):
    objects, secret = export(tmp_path / "job", image, "torchrun", TORCHRUN_JOB, "--nodes", "2",
                             "--ntasks-per-node", "2")
    job = objects[2]["metadata"]["name"]
    p = pods("ddp")
    started = time.monotonic()
    p.start(objects, image, secret)
    ends = p.wait()
    print(f"torchrun, 2 pods x 2 processes: {time.monotonic() - started:.1f} s\n{show(ends)}")
    check_allreduce(ends, job, 4, 2, secret["value"])


def test_a_failed_rank_ends_its_pod_with_its_code_and_no_pod_hangs(tmp_path, image, pods):
    objects, secret = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4",
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
    objects, secret = export(tmp_path / "job", image, "horovod", HOROVOD_JOB, "--nodes", "2", "--np", "4")
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
