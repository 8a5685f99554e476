"""Environment variables for a job's ranks: `kit run -e NAME=VALUE`, `-e NAME` (this shell's value) and
`--env-file FILE` (docker's format: NAME=VALUE or NAME a line, # comments). Pure.

Values reach the ranks through a file in every host's container (kit.backends.cluster.supervisor.launch.ENV_DIR, 0600, written
over kit's SSH session's input and removed when the job ends), never through a command line, which every user
of a host can read with `ps` (a container's processes are the host's). kit prints a value only for a name of a
short allow-list of harmless settings (SHOWN), and the job's record keeps the names alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

from kit.errors import BadInput, read_input

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What kit or the launchers set for each rank: a value from the user would override it (each rank reads the
# job's variables after its launcher set its own), or break the job.
RESERVED = {
    "KIT_JOB": "kit finds the job's processes by it", "KIT_SUPERVISOR": "kit finds the job's supervisor by it",
    "KIT_ENV": "kit tells the ranks that the job has variables by it",
    "KIT_RESTART": "kit sets it at each start of the job (0, then 1, 2... after restarts)",
    "KIT_PROGRESS_DIR": "kit's hang watch reads the ranks' heartbeats there",
    "PATH": "the image's venv must come first", "VIRTUAL_ENV": "the image's venv must come first",
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "--start-timeout sets it",
    "TF_CONFIG": "kit writes each worker's from the cluster",
    "GLOO_SOCKET_IFNAME": "kit gives each host its own interface on the training network (cluster.network)",
    "KIT_RANK_NICS": "kit gives each Horovod rank its host's interface on the training network by it",
    "MASTER_ADDR": "kit places the rendezvous", "MASTER_PORT": "kit places the rendezvous",
}
LAUNCHER_SET = re.compile(r"HOROVOD_(RANK|SIZE|LOCAL_.*|CROSS_.*|HOSTNAME|GLOO_.*|CONTROLLER|CPU_OPERATIONS|"
                          r"SECRET_KEY)|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|"
                          r"ROLE_.*|TORCHELASTIC_.*|TORCH_NCCL_ASYNC_ERROR_HANDLING")
# Read when the interpreter or the loader starts, before a rank can read the job's variables: they would not act.
AT_START = re.compile(r"PYTHON.*|LD_.*")
# The names whose values kit prints: an allow-list, not a search for secret-looking names (AZURE_STORAGE_
# CONNECTION_STRING, SLACK_WEBHOOK_URL, DATABASE_URL look like no secret and are). Each one below only tunes threads,
# devices, logging or the collectives, and none takes a credential; every other value is shown as (hidden), and
# the job's record keeps names only (see names).
SHOWN = frozenset({
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING",
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE", "NCCL_ALGO", "NCCL_PROTO",
    "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "PYTORCH_CUDA_ALLOC_CONF",
    "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_LOG_LEVEL", "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "TF_CPP_MIN_LOG_LEVEL", "TF_FORCE_GPU_ALLOW_GROWTH",
})
SHOWN_VALUE = re.compile(r"[A-Za-z0-9_.,:=+^-]{0,64}")  # numbers, device lists, levels, interfaces (^lo); no URL
HIDDEN = "(hidden)"


def shows_value(name: str, value: str) -> bool:
    """Whether kit may print a variable's value: an allow-listed name with a short plain value (a URL, a path with a
    token or anything with a / or @ in it is hidden even there)."""
    return name in SHOWN and bool(SHOWN_VALUE.fullmatch(value))


def _check_name(name: str, where: str) -> None:
    if not NAME.fullmatch(name):
        raise BadInput(f"{where}: '{name}' is not a variable name",
                       hint="use letters, digits and _, not starting with a digit: NAME=VALUE")
    if name in RESERVED or LAUNCHER_SET.fullmatch(name):
        why = RESERVED.get(name, "the launcher sets it for each rank")
        raise BadInput(f"{where}: {name} is kit's to set ({why})", hint=f"drop {name} from the job's environment"
                       + ("; use --start-timeout" if name == "HOROVOD_GLOO_TIMEOUT_SECONDS" else ""))
    if AT_START.fullmatch(name):
        raise BadInput(f"{where}: {name} acts when a rank's interpreter starts, before the job's variables are read",
                       hint="set it in the script (sys.path, os.environ before imports) or build it into the image "
                            "(kit.yaml build.pip/apt)")


def _one(text: str, where: str, environ: Mapping[str, str]) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    _check_name(name, where)
    if not eq:
        if name not in environ:
            raise BadInput(f"{where}: {name} has no value here (it is not set in this shell)",
                           hint=f"give it one: {name}=VALUE, or export {name} before kit run")
        value = environ[name]
    if "\0" in value:
        raise BadInput(f"{where}: the value of {name} holds a NUL byte", hint="an environment value cannot")
    return name, value


def parse(flags: list[str], files: list[Path], environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The job's variables: the files' in order, then the flags' (a later one wins, as with docker run)."""
    found: dict[str, str] = {}
    for path in files:
        text = read_input(path, "environment file", "give a file of NAME=VALUE lines (docker's --env-file format)")
        for number, line in enumerate(text.split("\n"), 1):  # lines end at \n alone, as in docker's format
            line = line.removesuffix("\r")
            if line.strip() and not line.lstrip().startswith("#"):
                name, value = _one(line.lstrip(), f"{path}:{number}", environ)
                found[name] = value
    for flag in flags:
        name, value = _one(flag, f"-e {flag.partition('=')[0]}", environ)
        found[name] = value
    return tuple(found.items())


def shown(env: tuple[tuple[str, str], ...]) -> str:
    """NAME=VALUE, ... for the terminal, every value hidden but those of allow-listed names (shows_value)."""
    return ", ".join(f"{k}={v if shows_value(k, v) else HIDDEN}" for k, v in env)


def names(env: tuple[tuple[str, str], ...]) -> str:
    """NAME, ...: what the job's record keeps of its variables (a record outlives the job: no value at all)."""
    return ", ".join(k for k, _ in env)


def env_file(env: tuple[tuple[str, str], ...]) -> bytes:
    """The file each rank reads before the script starts (kit.jobs.commands.horovod.rank_launcher): one JSON object."""
    return json.dumps(dict(env)).encode()
