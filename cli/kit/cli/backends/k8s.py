"""Kubernetes as a back end of `kit run` (kit.jobs.model.Backend): a kit job as manifests (kit.backends.k8s.manifests),
from the job's folder as kit run copies it (`kit export --to k8s` writes them); `kit run --on k8s` applies them and
follows the job (kit.backends.k8s.jobs); `kit jobs`, `kit logs` and `kit stop` for such a job."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import yaml
from rich.markup import escape
from rich.table import Table

from kit.backends.k8s import manifests as k8s
from kit.backends.k8s import jobs as k8sjobs
from kit.backends.slurm import sbatch
from kit.errors import BadInput, KitError
from kit.runners.local import LocalRunner
from kit.shown import visible
from kit.cluster.steps.workspace import Ignore, scan
from kit.cli.common import Where, cluster_settings, console, err_console, print_hangs
from kit.jobs import schedrecords
from kit.jobs import env as jobenv
from kit.jobs.model import COMMON, SCHEDULER_PLACEMENT, Job, new_job_id


class Kubernetes:
    """Kubernetes, where kubectl's current context answers."""

    name = "k8s"
    title = "Kubernetes"
    options = COMMON | {"np", "nodes", "ntasks_per_node", "gpus_per_node", "kind", "namespace", "image",
                        "workspace_pvc", "image_pull_secret", "cpus", "memory", "hang_timeout"}
    placement = SCHEDULER_PLACEMENT
    commands = frozenset()
    completions = {"kind": k8s.KINDS}

    def run(self, job: Job) -> None:
        _, cfg = cluster_settings(job.config, dict(name=job.name))
        o = job.option
        kind = o("kind")
        shape = sbatch.shape(job.launcher, job.nodes, job.np, job.ntasks_per_node, job.gpus_per_node, slurm=False)
        run_job(job.script, list(job.args), job.launcher, kind, shape, o("image") or cfg.image_tag,
                jobenv.parse(list(job.env), list(job.env_files), os.environ), o("namespace"), o("workspace_pvc"),
                o("image_pull_secret"), job.detach, job.env_files, o("cpus"), o("memory"), job.policy.hang_timeout)

    def find(self, ref: str, where: Where) -> Optional[k8sjobs.K8sRecord]:
        """The Kubernetes job a reference names, as Slurm's (kit.cli.backends.slurm)."""
        return None if ref == "last" and where.state is not None else k8sjobs.resolve(ref)

    def logs(self, record: k8sjobs.K8sRecord, where: Where, rank: Optional[int], follow: bool,
             tail: Optional[int]) -> None:
        logs(record, rank, follow, tail)

    def stop(self, record: k8sjobs.K8sRecord, where: Where) -> str:
        return stop(record)

    def rows(self, where: Where) -> list[dict]:
        return rows()

    def show(self, found: list[dict]) -> None:
        console.print(table(found))
        print_hangs(found)


def job_files(folder: Path, secrets: tuple[Path, ...] = ()) -> dict[str, tuple[bytes, bool]]:
    """The job's folder as a job's folder is copied (.kitignore, kit's defaults and the job's --env-file files,
    `secrets`, leave files out): path ->
    (content, executable). A link to a file of the folder is carried as that file; any other link is left out, and
    said: its target may be anything of this machine's. Sizes are added up before any file is read."""
    found = scan(folder, Ignore.of(folder, secrets))
    links = sorted(rel for rel in found.files if (folder / rel).is_symlink() and not _inside(folder / rel, folder))
    kept = [rel for rel in found.files if rel not in links]
    if links:
        err_console.print(f"kit: left out {len(links)} link(s) of the job's folder (a ConfigMap carries files, not "
                          f"links): {', '.join(links[:5])}{' ...' if len(links) > 5 else ''}", markup=False,
                          highlight=False)
    sizes = {rel: (folder / rel).stat().st_size for rel in kept}
    if (total := sum(sizes.values())) > k8s.CONFIGMAP_BYTES:
        largest = sorted(sizes, key=sizes.get, reverse=True)[:3]
        raise BadInput(f"the job's folder {folder} holds {total // 1024} KiB, more than the "
                       f"{k8s.CONFIGMAP_BYTES // 1024} KiB kit puts in a ConfigMap (largest: "
                       + ", ".join(f"{rel} {sizes[rel] // 1024} KiB" for rel in largest) + ")",
                       hint="put the folder on a PersistentVolumeClaim and give --workspace-pvc NAME, or leave "
                            "large files out with .kitignore")
    return {rel: ((folder / rel).read_bytes(), os.access(folder / rel, os.X_OK)) for rel in kept}


def _inside(link: Path, folder: Path) -> bool:
    return link.resolve().is_relative_to(folder) and link.resolve().is_file()


def make_job(script: Path, args: list[str], launcher: str, kind: str, shape: sbatch.Shape, image: str,
             variables: tuple[tuple[str, str], ...], namespace: Optional[str], workspace_pvc: Optional[str],
             pull_secret: Optional[str], name: str, secrets: tuple[Path, ...] = (), cpus: Optional[str] = None,
             memory: Optional[str] = None, hang_timeout: float = 0) -> k8s.K8sJob:
    """With a PVC, SCRIPT is its path on the volume and nothing here is read; else the script's folder is the job's
    (as kit run takes it: the folder the path names, its links resolved), but the --env-file files (`secrets`)."""
    job = k8s.K8sJob(name, kind, launcher, script.as_posix(), tuple(args), shape, image, {}, variables, namespace,
                     workspace_pvc, pull_secret, cpus, memory, hang_timeout=hang_timeout)
    if workspace_pvc is None:
        if not script.is_file():
            raise BadInput(f"{script}: no such file", hint="give the training script's path (or, with "
                           "--workspace-pvc, its path on the volume)")
        job = replace(job, script=script.name)
        k8s.check(job)  # before the folder is read
        job = replace(job, files=job_files(script.parent.resolve(), secrets))
        if script.name not in job.files:
            raise BadInput(f"{script}: a link to a file outside its folder, which the job's ConfigMap does not carry",
                           hint="run the file it leads to, or copy it into the folder")
    k8s.check(job)
    return job


def secret_note(job: k8s.K8sJob) -> None:
    """Where the job's secret variables must come from: their names, never their values."""
    if names := job.secret_names:
        literal = " ".join(f"--from-literal={n}=..." for n in names)
        err_console.print(f"kit: the job reads {', '.join(names)} from Secret {job.secret_name}, which the manifests "
                          f"do not hold; make it first: kubectl create secret generic {job.secret_name} {literal}"
                          + (f" -n {job.namespace}" if job.namespace else ""), markup=False, highlight=False)


# ------------------------------------------------------------------------------------------------ kit run --on k8s

def run_job(script: Path, args: list[str], launcher: str, kind: str, shape: sbatch.Shape, image: Optional[str],
                variables, namespace: Optional[str], workspace_pvc: Optional[str], pull_secret: Optional[str],
                detach: bool, secrets: tuple[Path, ...] = (), cpus: Optional[str] = None,
                memory: Optional[str] = None, hang_timeout: float = 0) -> None:
    k8s.check_kind(kind)
    if image is None:
        raise BadInput("--on k8s needs the image the pods pull", hint="push kit's image with `kit push "
                       "REGISTRY/REPO:TAG` and give it with --image (or set cluster.image_tag in kit.yaml)")
    job_id = new_job_id()
    job = make_job(script, args, launcher, kind, shape, image, variables, namespace, workspace_pvc,
                           pull_secret, k8s.job_name(script.as_posix(), job_id.rsplit("-", 1)[-1]), secrets, cpus,
                           memory, hang_timeout)
    run_on_k8s(job, job_id, detach)  # (make_job checked the job before kubectl is asked anything)



def run_on_k8s(job: k8s.K8sJob, job_id: str, detach: bool) -> None:
    """Apply the job where the current kube context answers, and follow it to its end (or return, with --detach).
    What kit applied is deleted when the apply fails half-way, when Ctrl-C or a pod that cannot start ends the
    follow; the job's Secret once the job ended."""
    runner = LocalRunner("kubectl")
    context = k8sjobs.check_cluster(runner)
    text = k8s.render(job)
    secret = {n: v for n, v in job.variables if n in job.secret_names}
    record = k8sjobs.K8sRecord(job_id, job.name, job.kind, context, job.namespace, job.launcher, job.script,
                               job.shape.ranks, time.time(),
                               k8sjobs.objects(job.name, list(yaml.safe_load_all(text)), bool(secret)))
    k8sjobs.save(record)
    try:
        k8sjobs.apply(runner, record, text, secret)
    except KitError:
        _give_up(runner, record, "failed")
        raise
    console.print(f"kit: job {job_id} is {job.kind} {job.name} in kube context {escape(context)}"
                  + (f", namespace {job.namespace}" if job.namespace else "") + f": {escape(sbatch.describe(job))}; "
                  + watch_line(job), highlight=False)
    if detach:
        console.print(f"kit stop {job_id} deletes it; kubectl get pods -l {k8s.LABEL}={job.name} shows its pods",
                      highlight=False)
        return
    try:
        ending = follow_job(runner, record, show)
    except KeyboardInterrupt:
        _give_up(runner, record, "stopped")
        raise KitError(f"job {job_id} interrupted: its objects were deleted", hint="kit run starts it again") from None
    except KitError:
        _give_up(runner, record, "failed")
        raise
    if not ending.hang:
        k8sjobs.forget_secret(runner, record)
        k8sjobs.ended(record, ending)
    report(job_id, ending)


def watch_line(job: k8s.K8sJob) -> str:
    if job.watched:
        return f"hang watch: {job.watched:g} s without progress"
    return "hang watch: off" + (f" (--kind {job.kind}'s pods start their ranks themselves)"
                                if job.hang_timeout else "")


def follow_job(runner: LocalRunner, record: k8sjobs.K8sRecord, shown) -> k8sjobs.Ending:
    """Follow the job to its end; one whose pods' hang watch said it hung has every rank's stack kept here
    (stacks_dir), and is deleted: its end is then failed, with the report naming the rank somewhere else."""
    hangs = k8sjobs.Hangs(record.ranks)
    ending = k8sjobs.follow(runner, record, shown, hangs=hangs)
    if ending.state != "hung":
        return ending
    show(None, None, f"kit: job {record.id} hung: {ending.hang}; deleting it")
    where = keep_stacks(record, hangs.stacks())
    k8sjobs.delete(runner, record)
    done = k8sjobs.Ending("failed", None, None, f"{ending.hang}; its objects were deleted, every rank's stack is in "
                                                f"{where}")
    k8sjobs.ended(record, done)
    return done


def stacks_dir(record: k8sjobs.K8sRecord) -> Path:
    """Where kit keeps a hung job's stacks: beside its record, in kit's home."""
    return schedrecords.folder("k8s") / f"{record.id}-stacks"


def keep_stacks(record: k8sjobs.K8sRecord, stacks: dict[int, tuple[str, str]]) -> Path:
    """Each rank's stack as its pod printed it, a file a rank (rank-N.txt) headed by the rank and its pod, in a
    folder made anew."""
    where = stacks_dir(record)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True, mode=0o700)
    for rank in range(record.ranks):
        pod, text = stacks.get(rank, ("?", ""))
        (where / f"rank-{rank}.txt").write_text(f"rank {rank} on {pod}\n"
                                                f"{text or '(no stack: its pod said none)'}\n")
    return where


def _give_up(runner: LocalRunner, record: k8sjobs.K8sRecord, state: str) -> None:
    try:
        k8sjobs.delete(runner, record)
    finally:
        k8sjobs.ended(record, k8sjobs.Ending(state))


def show(pod: str | None, rank: int | None, text: str) -> None:
    """A pod's line, with its pod and rank; kit's own (pod None) as it is."""
    prefix = f"[{pod} rank {rank}] " if rank is not None else f"[{pod}] " if pod else ""
    console.print(f"{prefix}{visible(text, one_line=True)}", markup=False, highlight=False)


def report(job_id: str, ending: k8sjobs.Ending) -> None:
    if ending.state == "succeeded":
        console.print(f"[green]✓[/] job {job_id} finished")
        return
    if ending.state == "stopped":
        raise KitError(f"job {job_id} was deleted before it ended", hint="kit run starts it again")
    if ending.hang:
        raise KitError(f"job {job_id} hung: {ending.hang}", hint=f"its output is above (`kit logs {job_id}`); a rank "
                       "that waits in a collective the others never reach is named at the line it waits on")
    where = f": pod {ending.pod} failed first (exit {ending.exit_code})" if ending.pod else ""
    raise KitError(f"job {job_id} failed{where}", hint="its output is above; `kubectl describe` on its pods says more "
                   "(an image that cannot be pulled, a pod that was evicted)").exiting(ending.exit_code)


def stop(record: k8sjobs.K8sRecord) -> str:
    """Delete what kit applied for the job, running or ended (an ended job's pods, ConfigMap and Secret stay until
    then)."""
    k8sjobs.delete(LocalRunner("kubectl"), record)
    if record.ended:
        return f"job {record.id} had ended ({record.ended['state']}): {', '.join(record.objects)} deleted"
    k8sjobs.ended(record, k8sjobs.Ending("stopped"))
    return f"[green]✓[/] job {record.id} stopped: {', '.join(record.objects)} deleted"


def logs(record: k8sjobs.K8sRecord, rank: Optional[int], follow: bool, tail: Optional[int]) -> None:
    """What the job's pods printed (the last `tail` lines of each), and with follow what they print until it ends."""
    runner = LocalRunner("kubectl")

    def shown(pod: str, r: int | None, text: str) -> None:
        if rank is None or r == rank:
            show(pod, r, text)
    if follow and not record.ended:
        ending = follow_job(runner, record, shown)
        if ending.state in ("succeeded", "failed", "stopped"):
            k8sjobs.seen_ended(runner, record, ending)
        console.print(f"kit: job {record.id} {ending.state}" +
                      (f" (exit {ending.exit_code})" if ending.exit_code is not None else "") +
                      (f": hung: {ending.hang}" if ending.hang else ""), markup=False, highlight=False)
        return
    for pod in k8sjobs.pods(runner, record):
        k8sjobs.pod_logs(runner, record, pod["metadata"]["name"], shown, follow=False, tail=tail)


def rows() -> list[dict]:
    """kit's Kubernetes jobs: an ended one as kit recorded it, a running one as its object's conditions say now (one
    kubectl call each; unknown where its context does not answer)."""
    out, now, runner = [], time.time(), LocalRunner("kubectl")
    for record in k8sjobs.records():
        how = record.ended.get("state")
        if how is None:
            try:
                how = k8sjobs.state(runner, record)
            except KitError:
                how = "unknown"
            if how in ("succeeded", "failed", "gone"):
                record = k8sjobs.seen_ended(runner, record, k8sjobs.Ending("stopped" if how == "gone" else how))
                how = record.ended.get("state", how)
        out.append(dict(id=record.id, name=record.name, kind=record.kind, context=record.context,
                        namespace=record.namespace, launcher=record.launcher, np=record.ranks, script=record.script,
                        state=how, exit=record.ended.get("exit"), submitted=int(record.submitted),
                        seconds=int(now - record.submitted), hang=record.ended.get("hang")))
    return out


def table(found: list[dict]) -> Table:
    t = Table(box=None, pad_edge=False, title="Kubernetes", title_justify="left")
    for column in ("job", "name", "kind", "context", "launcher", "np", "script", "state", "submitted", "exit"):
        t.add_column(column)
    for row in found:
        t.add_row(escape(row["id"]), escape(row["name"]), row["kind"], escape(row["context"]), row["launcher"],
                  str(row["np"]), escape(row["script"]), row["state"] + (" (hung)" if row["hang"] else ""),
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["submitted"])),
                  "" if row["exit"] is None else str(row["exit"]))
    return t
