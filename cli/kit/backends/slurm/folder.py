"""A Slurm job's folder on the login host's shared storage: made where it is safe (slurm.workdir, every folder above
it the user's or root's), the job's own folder copied into it with kit's files for its tasks and the sbatch script,
and the job's variables (0600, never in the script), for its first start and each one kit submits again."""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Iterator

from kit.backends.slurm.sbatch import ENV_DIR, SCRIPT_NAME, helper_files, helpers, helpers_dir
from kit.cluster.identity import write_file, write_secret
from kit.cluster.steps.workspace import Ignore, scan
from kit.data.transfer import tar_member
from kit.errors import KitError
from kit.runners import safefolder
from kit.runners.base import Runner

REMOTE_TIMEOUT_S = 60        # one command on the login host


# slurm.workdir and every folder above it must be safe (kit.runners.safefolder): otherwise someone could swap kit's
# job folder for a link between the copy and sbatch (and read the staged script and variables), or swap train.py while
# the job waits. One script on the login host: the work folder's path with its links resolved, checked folder by folder
# up to /, made (what is missing, the user's alone), found again where it was and checked again (someone who made a
# missing folder, or a link, first is caught), and the job's folder made new in it. Prints the job's folder.
_JOB_FOLDER = safefolder.CHECK_SH + r"""
top=$(realpath -m -- "$1") || exit 1
check "$top"
umask 077
mkdir -p -- "$top" || exit 1
[ "$(realpath -e -- "$top")" = "$top" ] || { echo "@@kit-unsafe moved - - $top"; exit 3; }
check "$top"
mkdir -m 700 -- "$top/$2" && cd -- "$top/$2" && pwd -P
"""


def job_folder(runner: Runner, workdir: str, job_id: str) -> str:
    """Make the job's folder under slurm.workdir (relative: to the login user's home) and say where it is, once that
    folder and every one above it are safe (the user's or root's, not writable by others unless sticky)."""
    r = runner.run(f"cd && sh -c {shlex.quote(_JOB_FOLDER)} kit-workdir {shlex.quote(workdir)} {shlex.quote(job_id)}",
                   timeout=REMOTE_TIMEOUT_S, changes=True)
    if bad := safefolder.unsafe(r.stdout):
        raise KitError(f"slurm.workdir {workdir}: {bad[0]} is {bad[1]}",
                       host=runner.host,
                       hint="set slurm.workdir (kit.yaml) to a folder of yours on storage every node sees, e.g. "
                            "kit-jobs in your home; a folder others may write needs the sticky bit (chmod +t) to be "
                            "safe for kit's job folders")
    r.check(f"cannot make the job's folder {workdir}/{job_id}",
            hint="slurm.workdir must be a folder the login user may write, on storage every node sees")
    return r.stdout.strip().splitlines()[-1]


def stage_archive(folder: Path, extra: dict[str, tuple[bytes, int]], secrets: tuple[Path, ...] = ()) -> Iterator[bytes]:
    """The job's folder (as a job's folder is copied: .kitignore and kit's defaults leave files out, and the job's
    --env-file files, `secrets`) and kit's files (path -> (content, mode)) as one tar stream, built in a temporary
    file (a job's folder may be large)."""
    found = scan(folder, Ignore.of(folder, secrets))
    with tempfile.TemporaryFile() as buffer:
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in found.files:
                tar.add(folder / rel, arcname=rel, recursive=False, filter=tar_member)
            for rel, (data, mode) in extra.items():
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), mode, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        buffer.seek(0)
        while chunk := buffer.read(1 << 20):
            yield chunk


def stage(runner: Runner, folder: Path, remote: str, script: str, variables: dict[str, str], job_id: str,
          secrets: tuple[Path, ...] = ()) -> None:
    """Copy the job's folder (but its --env-file files, `secrets`), its sbatch script, kit's files for its tasks and
    its variables (0600, in a 0700 folder) to `remote`."""
    extra = {SCRIPT_NAME: (script.encode(), 0o644)} | {path: (data, 0o644) for path, data in helper_files().items()}
    if variables:
        extra[f"{ENV_DIR}/{job_id}"] = (json.dumps(variables).encode(), 0o600)
    q = shlex.quote(remote)
    r = runner.stream_in(f"umask 077 && mkdir -p {q}/{ENV_DIR} && umask 022 && tar -x -C {q} -f - --no-same-owner",
                         stage_archive(folder, extra, secrets), lambda n: None, timeout=300)
    r.check(f"cannot copy the job's folder to {remote}", hint="the tail above says why (free space there?)")


def stage_variables(runner: Runner, remote: str, job_id: str, start: int, variables: dict[str, str]) -> None:
    """The job's variables' file for a start of the job after its first (variables_name: the batch script of the last
    start removes its own): 0600 in a 0700 folder of the job's folder, written only through folders that are no links
    (the job's folder is the job's to change)."""
    at = f"{ENV_DIR}/{variables_name(job_id, start)}"
    script = (f"cd -- {shlex.quote(remote)} && umask 077 && for d in {ENV_DIR.split('/')[0]} {ENV_DIR}; do "
              f'if [ -h "$d" ] || {{ [ -e "$d" ] && [ ! -d "$d" ]; }}; then echo "$d is not a folder" >&2; exit 3; fi; '
              f'mkdir -p -- "$d"; done && chmod 700 {ENV_DIR} && rm -f -- {at}.new && '
              f"set -o noclobber && cat > {at}.new && mv -f -- {at}.new {at}")
    runner.run(script, stdin=json.dumps(variables).encode(), timeout=REMOTE_TIMEOUT_S, changes=True).check(
        f"cannot write the job's variables in {remote}/{ENV_DIR} again", hint="the tail above says why")


def variables_name(job_id: str, start: int) -> str:
    """The name of a start's variables' file in ENV_DIR: the job's id, then `.N` for the Nth start after the first
    (the batch script of the last start may remove its own as the next one begins: templates/sbatch.j2)."""
    return f"{job_id}.{start}" if start else job_id


def variables_file(variables: tuple[tuple[str, str], ...]) -> tuple[str, bytes]:
    """kit export --to slurm's -e and --env-file: (the file's name in ENV_DIR, from what it holds: another
    export of other values is another file; its content, JSON as each rank reads it)."""
    data = json.dumps(dict(variables), sort_keys=True).encode()
    return "export-" + hashlib.sha256(data).hexdigest()[:12], data


def write_variables(variables: tuple[tuple[str, str], ...], folder: Path) -> str:
    """The variables' file in the folder's ENV_DIR (mode 0600 in a 0700 folder), never in the script; its
    name."""
    name, data = variables_file(variables)
    env_dir = folder / ENV_DIR
    env_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    env_dir.chmod(0o700)  # (one that was there already, too)
    write_secret(env_dir / name, data)
    return name


def write_helpers(folder: Path) -> str:
    """kit's files for the tasks of an exported script, in the folder's HELPERS_DIR-... (written where they
    are not there as kit made them); that folder."""
    for rel, data in helper_files().items():
        path = folder / rel
        if not path.is_file() or path.read_bytes() != data:
            write_file(path, data, 0o644)
    return helpers_dir(helpers())
