"""`kit export --to k8s`: a kit job as Kubernetes manifests (kit.k8s), from the job's folder as kit run copies it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from rich.markup import escape

from kit import k8s, sbatch
from kit.errors import BadInput
from kit.steps.workspace import Ignore, scan
from kit.cli.common import console, err_console


def job_files(folder: Path) -> dict[str, tuple[bytes, bool]]:
    """The job's folder as a job's folder is copied (.kitignore and kit's defaults leave files out): path ->
    (content, executable)."""
    found = scan(folder, Ignore.of(folder))
    return {rel: ((folder / rel).read_bytes(), os.access(folder / rel, os.X_OK)) for rel in found.files}


def make_job(script: Path, args: list[str], launcher: str, kind: str, shape: sbatch.Shape, image: str,
             variables: tuple[tuple[str, str], ...], namespace: Optional[str], workspace_pvc: Optional[str],
             name: str) -> k8s.K8sJob:
    """With a PVC, SCRIPT is its path on the volume and nothing here is read; else the script's folder is the job's."""
    if workspace_pvc is not None:
        return k8s.K8sJob(name, kind, launcher, script.as_posix(), tuple(args), shape, image, {}, variables,
                          namespace, workspace_pvc)
    if not script.is_file():
        raise BadInput(f"{script}: no such file", hint="give the training script's path (or, with --workspace-pvc, "
                       "its path on the volume)")
    folder = script.resolve().parent
    return k8s.K8sJob(name, kind, launcher, script.name, tuple(args), shape, image, job_files(folder), variables,
                      namespace, workspace_pvc)


def secret_note(job: k8s.K8sJob) -> None:
    """Where the job's secret variables must come from: their names, never their values."""
    if names := job.secret_names:
        literal = " ".join(f"--from-literal={n}=..." for n in names)
        err_console.print(f"kit: {', '.join(names)} are read from Secret {job.secret}, which the manifests do not hold; "
                      f"make it first: kubectl create secret generic {job.secret} {literal}"
                      + (f" -n {job.namespace}" if job.namespace else ""), markup=False, highlight=False)


def write(text: str, output: Optional[Path], writable) -> None:
    if output is None:
        print(text, end="")
        return
    path = writable(output.absolute())
    path.write_text(text)
    console.print(f"[green]✓[/] wrote {escape(str(path))}: kubectl apply -f {escape(path.name)}", highlight=False)
