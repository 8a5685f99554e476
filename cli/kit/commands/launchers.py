"""torchrun and TensorFlow's multi-worker jobs: one command per host, started over the cluster SSH from
the primary's container by a small bash script. Pure; tested by exact equality, run in tests/lab.

Their output is made to look like horovodrun's (`[RANK]<stdout>:text`, each rank's `@@kit-exit` line
from the rank launcher), so streaming, logs, failure naming and Ctrl-C are the Horovod launch's.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from kit.commands.horovod import Slot

LAUNCHERS = ("horovod", "torchrun", "tf")
# What each image framework can run: torch + Horovod images horovodrun and torchrun; TensorFlow images tf.
FRAMEWORK_LAUNCHERS = {"horovod": ("horovod", "torchrun"), "tensorflow": ("tf",)}
# Variables of the primary's container that the commands on every host need (an SSH session starts
# with sshd's environment, not the image's).
FORWARDED = ("PATH", "VIRTUAL_ENV", "LANG", "LC_ALL", "PYTHONUNBUFFERED", "KIT_JOB", "KIT_ENV")
# torchrun prefixes every line of a worker with its global rank, as horovodrun does.
TORCHRUN_PREFIX = "[${rank}]<stdout>:"

# A port nothing listens on now, from the kernel's ephemeral range.
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


@dataclass(frozen=True)
class NodeCommand:
    host: str          # the name in hosts.txt
    address: str       # where the primary's container reaches it
    argv: tuple[str, ...]
    rank: int | None   # every line is this rank's (tf: one worker a host); None: lines carry their rank


def torchrun_argv(nodes: int, nproc: int, node_rank: int, master: str, port: int, command: list[str]) -> list[str]:
    """One node of a static rendezvous: the c10d store on the primary's cluster address, node ranks from the
    inventory (hosts.txt order), so global ranks are node_rank * nproc + local rank."""
    return ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={nproc}", f"--node-rank={node_rank}",
            f"--master-addr={master}", f"--master-port={port}", "--tee=3", "--no-python", *command]


def torch_ranks(slots: list[Slot], nproc: int | None) -> list[Slot]:
    """The host of each global rank: torchrun numbers node 0's workers first, then node 1's..."""
    return [s for s in slots for _ in range(nproc or s.slots)]


def tf_config(workers: list[str], index: int) -> str:
    """TF_CONFIG of worker `index`: every worker's address:port, in inventory order."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}},
                      separators=(",", ":"))


def _filter(node: NodeCommand) -> str:
    """sed (unbuffered: lines stream) that makes each line of a host's output a rank line, or labels it
    with the host."""
    if node.rank is not None:
        program = f"s/^/[{node.rank}]<stdout>:/"
    else:
        program = f"/^\\[[0-9]*\\]<std\\(out\\|err\\)>:/!s/^/{node.host}: /"
    return "sed -u " + shlex.quote(program)


def fanout_script(workspace: str, nodes: list[NodeCommand]) -> str:
    """bash for the primary's container: every host's command at once over the cluster SSH; lines as they
    come; at the first failure the others' SSH sessions are closed (kit then stops what is left on every
    host by KIT_JOB). Exits 0, or with the first failure's status."""
    lines = [
        "set -m -o pipefail  # job control: each host's pipeline is a process group, stopped as one",
        "stop() { for group in $(jobs -p); do kill -- -$group 2>/dev/null; done; }",
        "trap 'stop; exit 130' INT TERM",
        "fwd=''; for v in " + " ".join(FORWARDED) + "; do [ -n \"${!v}\" ] && fwd+=\"$v=$(printf %q \"${!v}\") \"; done",
        "declare -A running",
    ]
    for n in nodes:
        remote = shlex.quote(shlex.join(n.argv))
        lines.append(f"ssh {shlex.quote(n.address)} \"cd {shlex.quote(workspace)} && exec env $fwd\" "
                     f"{remote} < /dev/null 2>&1 | {_filter(n)} &")
        lines.append(f"running[$!]={shlex.quote(n.host)}")
    lines += [
        "code=0",
        "while [ ${#running[@]} -gt 0 ]; do",
        "  wait -n -p ended 2>/dev/null; rc=$?  # (without the job-control chatter about stopped jobs)",
        "  [ -z \"$ended\" ] && break",
        "  host=${running[$ended]}; unset \"running[$ended]\"",
        "  if [ $rc -ne 0 ] && [ $code -eq 0 ]; then",
        "    code=$rc; echo \"$host: its processes ended with status $rc; stopping the others\"",
        "    stop",
        "  fi",
        "done",
        "exit $code",
    ]
    return "\n".join(lines) + "\n"
