"""`kit run --on k8s`: the job's manifests (kit.backends.k8s.manifests) applied with kubectl where a kube context answers, the pods'
output followed with each rank's prefix, the job's end read from its object's conditions, and `kit stop` deleting
it. kubectl does the talking: the context, credentials and namespace are the user's (~/.kube/config, KUBECONFIG),
never kit's. Commands run over a local runner, each with a timeout; every value in them is quoted.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from kit.jobs import schedrecords
from kit.jobs.commands.horovod import split_rank
from kit.backends.cluster.supervisor.heartbeats import Beat, hang_report
from kit.backends.k8s import podtask
from kit.backends.k8s.manifests import secret_name
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
# A pod that waits for one of these is not going to start by itself (an image it cannot pull, a Secret it lacks).
STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
         "CreateContainerError"}
STUCK_S = 180
UNANSWERED = 5  # kubectl's failures in a row that end the follow (one is a hiccup of the API server)
HANG_WAIT_S = podtask.SETTLE_S + 10  # after a first pod said it hung, for the others to say where their ranks are
WHERE_CHARS, STACK_LINE_CHARS = 300, 1000  # of a rank's place and of each line of its stack, kept


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
    state: str                   # succeeded, failed, stopped; hung (the pods' hang watch said so: kit is to delete it)
    exit_code: int | None = None  # the first failed container's
    pod: str | None = None
    hang: str = ""               # the hang report, naming the rank(s) somewhere else than the others


class Hangs:
    """What the pods' hang watches said (kit.backends.k8s.podtask.HANG_LINES), from every pod's output as kit reads
    it: where each rank is, its stack, and which pods said they hung. The output is the job's: a watch's line is one
    that no rank's prefix is on (a rank's own lines carry theirs); the pod is the one whose log kit read, never what a
    line says; a rank is one of the job's, and the first pod that speaks for it keeps it; its text is cut."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.lock = threading.Lock()
        self.where: dict[int, tuple[str, str]] = {}    # rank -> (pod, where)
        self.stack: dict[int, list[str]] = {}
        self.hung: dict[str, int] = {}                 # pod -> the seconds it said
        self.first: float | None = None                # when a first pod said it hung (monotonic)

    def feed(self, pod: str, text: str) -> bool:
        """Whether the line (a pod's, without a rank's prefix) is a watch's: kept here, not shown as output."""
        mark, _, rest = text.partition(" ")
        if mark not in podtask.HANG_LINES:
            return False
        number, _, value = rest.partition(" ")
        if not (number.isascii() and number.isdigit() and len(number) <= 9):
            return True  # (a watch's mark with no number after it: no line of output either)
        with self.lock:
            if mark == "@@kit-hung":
                self.hung.setdefault(pod, int(number))
                self.first = self.first or time.monotonic()
                return True
            rank = int(number)
            owner = self.where.get(rank, (pod, ""))[0]
            try:
                said = json.loads(value)
            except ValueError:
                return True
            if rank >= self.ranks or owner != pod or not isinstance(said, str):
                return True
            if mark == "@@kit-hang-at":
                self.where[rank] = (pod, said[:WHERE_CHARS])
            elif rank in self.where and sum(map(len, self.stack.get(rank, []))) < podtask.STACK_BYTES:
                self.stack.setdefault(rank, []).append(said[:STACK_LINE_CHARS])
        return True

    def settled(self, running: set[str]) -> bool:
        """Whether every pod that still runs has said it hung, or HANG_WAIT_S passed since the first did."""
        with self.lock:
            return self.first is not None and (running <= set(self.hung) or
                                               time.monotonic() - self.first > HANG_WAIT_S)

    def report(self) -> str:
        """hang_report's words, as the cluster's and Slurm's watch say them: the rank and pod somewhere else."""
        with self.lock:
            beats = [Beat(pod, rank, 0, where) for rank, (pod, where) in sorted(self.where.items())]
            return hang_report(beats, max(self.hung.values(), default=0))

    def stacks(self) -> dict[int, tuple[str, str]]:
        """rank -> (its pod, its stack)."""
        with self.lock:
            return {rank: (pod, "\n".join(self.stack.get(rank, []))) for rank, (pod, _) in self.where.items()}


def save(record: K8sRecord) -> None:
    schedrecords.save("k8s", record)


def records() -> list[K8sRecord]:
    return schedrecords.load("k8s", lambda data: K8sRecord(**{**data, "objects": tuple(data.get("objects", ()))}))


def resolve(ref: str) -> K8sRecord | None:
    """The Kubernetes job `ref` names (kit's forms of a job id), None when it names none."""
    from kit.jobs.model import pick_record
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
    if not r.ok or not context or any(ord(c) < 32 or c == "\x7f" for c in context):
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
               "metadata": {"name": secret_name(record.name), "labels": {"app.kubernetes.io/managed-by": "kit"}},
               "stringData": secret}
        # create, not apply: apply would also keep the values in an annotation of the Secret
        runner.run(kubectl(record.context, record.namespace, "create", "--filename=-"),
                   stdin=json.dumps(obj).encode(), timeout=APPLY_TIMEOUT_S).check(
            f"cannot make Secret {secret_name(record.name)} for the job's variables")
    # server-side: a client-side apply keeps a copy of each object in an annotation of 256 KiB at most
    runner.run(kubectl(record.context, record.namespace, "apply", "--server-side", "--field-manager=kit",
                       "--filename=-"), stdin=manifests.encode(),
               timeout=APPLY_TIMEOUT_S).check(
        f"kubectl apply of job {record.id} failed",
        hint="the tail above says why; an operator's kind needs its operator installed (--kind indexed-job needs "
             "none)")


def objects(name: str, manifests: list[dict], secret: bool) -> tuple[str, ...]:
    """resource/name of everything kit applies for job `name`, the Secret last."""
    return (*(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in manifests),
            *([f"secret/{secret_name(name)}"] if secret else []))


def _json(runner: Runner, record: K8sRecord, *args: str) -> dict | None:
    r = runner.run(kubectl(record.context, record.namespace, "get", *args, "--output=json",
                           "--request-timeout=20s"), timeout=TIMEOUT_S)
    if not r.ok and "NotFound" in r.stderr:
        return None
    r.check(f"cannot read job {record.id} from Kubernetes")
    try:
        return json.loads(r.stdout)
    except ValueError:
        raise KitError(f"kubectl's answer about job {record.id} is not JSON", host=r.host, command=r.command,
                       output_tail=r.stdout[-500:]) from None


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
           sleep: Callable[[float], None] = time.sleep, hangs: Hangs | None = None) -> Ending:
    """Each pod's output as it comes (from its start, once it has one), and why a pod waits when that changes, until
    the job's object says it ended, or its pods' hang watch said it hung (`hangs`: then state hung, once every pod
    that runs has said so, HANG_WAIT_S at most). A pod stuck where it cannot start by itself (STUCK) for STUCK_S ends
    the follow with a KitError; so do UNANSWERED failures of kubectl in a row."""
    hangs = hangs or Hangs(record.ranks)
    followed: dict[str, threading.Thread] = {}
    waits: dict[str, tuple[str, float]] = {}
    failures = 0
    while True:
        try:
            now, found = state(runner, record), pods(runner, record)
            failures = 0
        except KitError:
            failures += 1
            if failures >= UNANSWERED:
                raise
            sleep(POLL_S)
            continue
        for pod in found:
            name = pod["metadata"]["name"]
            if name not in followed and pod.get("status", {}).get("phase") in ("Running", "Succeeded", "Failed"):
                followed[name] = threading.Thread(target=pod_logs, args=(runner, record, name, show, True, None,
                                                                         hangs), daemon=True)
                followed[name].start()
            _watch_wait(name, waiting(pod), waits, show)
        running = {p["metadata"]["name"] for p in found if p.get("status", {}).get("phase") in (None, "Pending",
                                                                                               "Running")}
        if hangs.hung and now == "running" and hangs.settled(running):
            return Ending("hung", hang=hangs.report())
        if now != "running":
            for t in followed.values():
                t.join(TIMEOUT_S)
            if hangs.hung:  # (its pods ended, the Job failed, before kit looked again)
                return Ending("hung", hang=hangs.report())
            failure = first_failure(found)
            state_of = "stopped" if now == "gone" else now
            return Ending(state_of, failure[1] if failure else None, failure[0] if failure else None)
        sleep(POLL_S)


def waiting(pod: dict) -> tuple[str, str] | None:
    """(reason, message) of what a pod waits for: a container's waiting state, or the scheduler's refusal."""
    status = pod.get("status", {})
    for c in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
        if (w := c.get("state", {}).get("waiting")) and w.get("reason") not in (None, "ContainerCreating"):
            return w["reason"], w.get("message", "")
    for c in status.get("conditions", []):
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return c.get("reason", "Unschedulable"), c.get("message", "")
    return None


def _watch_wait(pod: str, now: tuple[str, str] | None, waits: dict, show) -> None:
    before = waits.get(pod)
    if now is None:
        waits.pop(pod, None)
        return
    if before is None or before[0] != now[0]:
        waits[pod] = (now[0], time.monotonic())
        show(pod, None, f"kit: waiting: {now[0]}" + (f" ({now[1]})" if now[1] else ""))
    elif now[0] in STUCK and time.monotonic() - before[1] > STUCK_S:
        raise KitError(f"pod {pod} has not started in {STUCK_S} s: {now[0]}" + (f" ({now[1]})" if now[1] else ""),
                       hint="ErrImagePull/ImagePullBackOff: is the image in a registry the cluster reaches (kit push), "
                            "with --image-pull-secret where it asks for a login? CreateContainerConfigError: does "
                            "the job's Secret exist?")


def pod_logs(runner: Runner, record: K8sRecord, pod: str, show, follow: bool = True, tail: int | None = None,
             hangs: Hangs | None = None) -> None:
    """A pod's output, each line with its rank where it has one; with follow, until the pod ends. The hang watch's
    lines go to `hangs` (without one, they are shown as the pod's)."""
    def line(text: str) -> None:
        pod_line(pod, text, show, hangs)
    runner.stream_out(kubectl(record.context, record.namespace, "logs", *(["--follow"] if follow else []),
                              *([f"--tail={tail}"] if tail is not None else []), "--all-containers=true", pod), line)


def pod_line(pod: str, text: str, show, hangs: Hangs | None = None) -> None:
    """One line of a pod's output: a rank's (its prefix read), a hang watch's line of the pod (to `hangs`), or the
    pod's own."""
    rank, rest = split_rank(text)
    if rank is None and hangs is not None and hangs.feed(pod, rest):
        return
    show(pod, rank, rest)


def delete(runner: Runner, record: K8sRecord, objects: tuple[str, ...] | None = None) -> None:
    """What kit applied for the job (or those of `objects`); what is gone already is no failure."""
    runner.run(kubectl(record.context, record.namespace, "delete", *(record.objects if objects is None else objects),
                       "--ignore-not-found=true", "--wait=true", "--timeout=60s"),
               timeout=90).check(f"cannot delete job {record.id}")


def forget_secret(runner: Runner, record: K8sRecord) -> None:
    """The job's Secret, once the job ended: its values need not outlive it."""
    if secrets := tuple(o for o in record.objects if o.startswith("secret/")):
        delete(runner, record, secrets)


def ended(record: K8sRecord, ending: Ending) -> K8sRecord:
    done = replace(record, ended={"state": ending.state, "exit": ending.exit_code,
                                  **({"hang": ending.hang} if ending.hang else {})})
    save(done)
    return done


def seen_ended(runner: Runner, record: K8sRecord, ending: Ending) -> K8sRecord:
    """The first time kit sees the job ended (`kit run`, `kit jobs`, `kit logs -f`: whichever comes first): its
    Secret deleted, and its end saved. A detached job's values would otherwise stay in the namespace until kit stop."""
    try:
        forget_secret(runner, record)
    except KitError:
        return record  # (its context does not answer: the next look tries again)
    return ended(record, ending)
