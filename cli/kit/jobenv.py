"""Environment variables for a job's ranks: `kit run -e NAME=VALUE`, `-e NAME` (this shell's value) and
`--env-file FILE` (docker's format: NAME=VALUE or NAME a line, # comments). Pure.

Values reach the ranks through a file in every host's container (kit.commands.horovod.ENV_DIR, 0600, written
over kit's SSH session's input and removed when the job ends), never through a command line, which every user
of a host can read with `ps` (a container's processes are the host's). What kit prints or records of them
hides the value of every name that looks like a secret.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

from kit.errors import BadInput, read_input

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What kit or the launchers set for each rank: a value from the user would be overwritten, or break the job.
RESERVED = {
    "KIT_JOB": "kit finds the job's processes by it",
    "PATH": "the image's venv must come first", "VIRTUAL_ENV": "the image's venv must come first",
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "--start-timeout sets it",
    "TF_CONFIG": "kit writes each worker's from the cluster",
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "kit reads each line's rank from it",
    "RANK": "the launcher numbers the ranks", "LOCAL_RANK": "the launcher numbers the ranks",
    "WORLD_SIZE": "the launcher numbers the ranks", "MASTER_ADDR": "kit places the rendezvous",
    "MASTER_PORT": "kit places the rendezvous",
}
# horovodrun does not pass these to the ranks it starts (horovod/runner/common/util/env.py: IGNORE_REGEXES).
HOROVOD_IGNORED = re.compile(r"BASH_FUNC_.*|OLDPWD|.*CUDA_VISIBLE_DEVICES|HOROVOD_SECRET_KEY")
# Hiding a harmless value costs nothing; showing a key costs a lot: any name with one of these in it.
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|PWD|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION|(^|_)PASS(_|$)", re.IGNORECASE)
HIDDEN = "(hidden)"


def looks_secret(name: str) -> bool:
    return bool(SECRET.search(name))


def _check_name(name: str, where: str, launcher: str) -> None:
    if not NAME.fullmatch(name):
        raise BadInput(f"{where}: '{name}' is not a variable name",
                       hint="use letters, digits and _, not starting with a digit: NAME=VALUE")
    if name in RESERVED:
        raise BadInput(f"{where}: {name} is kit's to set ({RESERVED[name]})", hint=f"drop {name} from the job's "
                       "environment" + ("; use --start-timeout" if name == "HOROVOD_GLOO_TIMEOUT_SECONDS" else ""))
    if launcher == "horovod" and HOROVOD_IGNORED.fullmatch(name):
        raise BadInput(f"{where}: horovodrun does not pass {name} to the ranks on other hosts",
                       hint="Horovod gives each rank its GPU by local rank; drop it" if "CUDA_VISIBLE_DEVICES" in name
                       else f"drop {name}, or run the job with --launcher torchrun")


def _one(text: str, where: str, launcher: str, environ: Mapping[str, str]) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    _check_name(name, where, launcher)
    if not eq:
        if name not in environ:
            raise BadInput(f"{where}: {name} has no value here (it is not set in this shell)",
                           hint=f"give it one: {name}=VALUE, or export {name} before kit run")
        value = environ[name]
    if "\0" in value:
        raise BadInput(f"{where}: the value of {name} holds a NUL byte", hint="an environment value cannot")
    return name, value


def parse(flags: list[str], files: list[Path], launcher: str,
          environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The job's variables: the files' in order, then the flags' (a later one wins, as with docker run)."""
    found: dict[str, str] = {}
    for path in files:
        text = read_input(path, "environment file", "give a file of NAME=VALUE lines (docker's --env-file format)")
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                name, value = _one(line.lstrip(), f"{path}:{number}", launcher, environ)
                found[name] = value
    for flag in flags:
        name, value = _one(flag, f"-e {flag.partition('=')[0]}", launcher, environ)
        found[name] = value
    return tuple(found.items())


def shown(env: tuple[tuple[str, str], ...]) -> str:
    """NAME=VALUE, ..., with the value of every secret-looking name hidden: for the terminal and the record."""
    return ", ".join(f"{k}={HIDDEN if looks_secret(k) else v}" for k, v in env)


def env_file(env: tuple[tuple[str, str], ...]) -> bytes:
    """The file each rank reads before the script starts (kit.commands.horovod.rank_launcher): one JSON object."""
    return json.dumps(dict(env)).encode()
