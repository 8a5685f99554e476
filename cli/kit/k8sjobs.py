"""`kit run --on k8s`: the job's manifests (kit.k8s) applied with kubectl where a kube context answers, the pods'
output followed with each rank's prefix, the job's end read from its object's conditions, and `kit stop` deleting
it. kubectl does the talking: the context, credentials and namespace are the user's (~/.kube/config, KUBECONFIG),
never kit's. Commands run over a local runner, each with a timeout; every value in them is quoted.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from kit import schedrecords
from kit.commands.horovod import split_rank
from kit.errors import KitError
from kit.runners.base import Runner

TIMEOUT_S = 30
APPLY_TIMEOUT_S = 120
POLL_S = 2.0
EXPORT_HINT = ("`kit export --to k8s SCRIPT -o job.yaml` writes the job's manifests, to apply with kubectl where a "
               "cluster answers")
# Each kind's object, as kubectl names its resource; the conditions that say it ended.
RESOURCES = {"indexed-job": "jobs.batch", "jobset": "jobsets.jobset.x-k8s.io", "pytorchjob": "pytorchjobs.kubeflow.org",
             "tfjob": "tfjobs.kubeflow.org", "mpijob": "mpijobs.kubeflow.org",
             "trainjob": "trainjobs.trainer.kubeflow.org"}
SUCCEEDED, FAILED = {"Complete", "Completed", "Succeeded"}, {"Failed"}
REF = re.compile(r"[-A-Za-z0-9_.:@/]{1,253}")  # a kube context's name as kit passes it on


@dataclass(frozen=True)
class K8sRecord:
    """kit's note of a job it applied: in kit's home, k8s/<id>.json."""

    id: str
    name: str
    kind: str
    context: str
    namespace: str | None
    launcher: str
    script: str
    ranks: int
    submitted: float
    objects: tuple[str, ...] = ()  # resource/name of everything kit applied, deleted by kit stop
    ended: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Ending:
    state: str                   # succeeded, failed, stopped
    exit_code: int | None = None  # the first failed container's
    pod: str | None = None


def save(record: K8sRecord) -> None:
    schedrecords.save("k8s", record)


def records() -> list[K8sRecord]:
    return schedrecords.load("k8s", lambda data: K8sRecord(**{**data, "objects": tuple(data.get("objects", ()))}))


def resolve(ref: str) -> K8sRecord | None:
    """The Kubernetes job `ref` names (kit's forms of a job id), None when it names none."""
    from kit.jobrecords import pick_record
    return pick_record(ref, {r.id: r for r in records()}, "Kubernetes")


def kubectl(context: str, namespace: str | None, *args: str) -> str:
    return shlex.join(["kubectl", f"--context={context}", *([f"--namespace={namespace}"] if namespace else []),
                       *args])


def check_cluster(runner: Runner) -> str:
    """The current kube context, once its API server answers; else why none does, and what to do instead."""
    r = runner.run("kubectl config current-context", timeout=TIMEOUT_S)
    if r.exit_code == 127:
        raise KitError("kubectl is not installed here: kit runs a job on Kubernetes through it", hint=EXPORT_HINT)
    context = r.stdout.strip()
    if not r.ok or not REF.fullmatch(context):
        raise KitError("no Kubernetes cluster to run on: kubectl has no current context", output_tail=r.tail(),
                       hint=f"`kubectl config use-context NAME` picks one; or {EXPORT_HINT}")
    v = runner.run(kubectl(context, None, "version", "--output=json", "--request-timeout=10s"), timeout=TIMEOUT_S)
    try:
        answered = v.ok and "serverVersion" in json.loads(v.stdout)
    except ValueError:
        answered = False
    if not answered:
        raise KitError(f"no Kubernetes cluster answers at kube context {context}", output_tail=v.tail(),
                       hint=f"check the cluster and your credentials (`kubectl cluster-info`); or {EXPORT_HINT}")
    return context


def apply(runner: Runner, record: K8sRecord, manifests: str, secret: dict[str, str]) -> None:
    """The Secret first (its values go to kubectl's input, never to a file or a command line), then the job."""
    if secret:
        obj = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": f"{record.name}-env", "labels": {"app.kubernetes.io/managed-by": "kit"}},
               "stringData": secret}
        # create, not apply: apply would also keep the values in an annotation of the Secret
        runner.run(kubectl(record.context, record.namespace, "create", "--filename=-"),
                   stdin=json.dumps(obj).encode(), timeout=APPLY_TIMEOUT_S).check(
            f"cannot make Secret {record.name}-env for the job's variables")
    runner.run(kubectl(record.context, record.namespace, "apply", "--filename=-"), stdin=manifests.encode(),
               timeout=APPLY_TIMEOUT_S).check(
        f"kubectl apply of job {record.id} failed",
        hint="the tail above says why; an operator's kind needs its operator installed (--kind indexed-job needs "
             "none)")


def objects(manifests: list[dict], secret: bool) -> tuple[str, ...]:
    names = [f"{d['kind'].lower()}/{d['metadata']['name']}" for d in manifests]
    return (*names, *([f"secret/{manifests[0]['metadata']['name'].removesuffix('-files')}-env"] if secret else []))


def _json(runner: Runner, record: K8sRecord, *args: str) -> dict | None:
    r = runner.run(kubectl(record.context, record.namespace, "get", *args, "--output=json",
                           "--request-timeout=20s"), timeout=TIMEOUT_S)
    if not r.ok and "NotFound" in r.stderr:
        return None
    r.check(f"cannot read job {record.id} from Kubernetes")
    return json.loads(r.stdout)


def state(runner: Runner, record: K8sRecord) -> str:
    """running, succeeded, failed, or gone (deleted), from the job object's conditions."""
    obj = _json(runner, record, RESOURCES[record.kind], record.name)
    if obj is None:
        return "gone"
    true = {c.get("type") for c in obj.get("status", {}).get("conditions", []) if c.get("status") == "True"}
    return "failed" if true & FAILED else "succeeded" if true & SUCCEEDED else "running"


def pods(runner: Runner, record: K8sRecord) -> list[dict]:
    found = _json(runner, record, "pods", f"--selector=app.kubernetes.io/instance={record.name}")
    return found.get("items", []) if found else []


def first_failure(found: list[dict]) -> tuple[str, int] | None:
    """(pod, exit code) of the container that failed first."""
    failed = []
    for pod in found:
        for c in pod.get("status", {}).get("containerStatuses", []):
            ended = c.get("state", {}).get("terminated") or {}
            if ended.get("exitCode"):
                failed.append((ended.get("finishedAt", ""), pod["metadata"]["name"], int(ended["exitCode"])))
    return min(failed)[1:] if failed else None


def follow(runner: Runner, record: K8sRecord, show: Callable[[str, int | None, str], None],
           sleep: Callable[[float], None] = time.sleep) -> Ending:
    """Each pod's output as it comes (from its start, once it has one), until the job's object says it ended."""
    followed: dict[str, threading.Thread] = {}
    while True:
        now = state(runner, record)
        found = pods(runner, record)
        for pod in found:
            name = pod["metadata"]["name"]
            if name not in followed and pod.get("status", {}).get("phase") in ("Running", "Succeeded", "Failed"):
                followed[name] = threading.Thread(target=_logs, args=(runner, record, name, show), daemon=True)
                followed[name].start()
        if now != "running":
            for t in followed.values():
                t.join(TIMEOUT_S)
            failure = first_failure(found)
            state_of = "stopped" if now == "gone" else now
            return Ending(state_of, failure[1] if failure else None, failure[0] if failure else None)
        sleep(POLL_S)


def _logs(runner: Runner, record: K8sRecord, pod: str, show) -> None:
    def line(text: str) -> None:
        rank, rest = split_rank(text)
        show(pod, rank, rest)
    runner.stream_out(kubectl(record.context, record.namespace, "logs", "--follow", "--all-containers=true", pod),
                      line)


def delete(runner: Runner, record: K8sRecord) -> None:
    runner.run(kubectl(record.context, record.namespace, "delete", *record.objects, "--ignore-not-found=true",
                       "--wait=true", "--timeout=60s"), timeout=90).check(f"cannot delete job {record.id}")


def ended(record: K8sRecord, ending: Ending) -> K8sRecord:
    done = replace(record, ended={"state": ending.state, "exit": ending.exit_code})
    save(done)
    return done
