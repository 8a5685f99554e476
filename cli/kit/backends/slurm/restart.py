"""`kit run --on slurm --restarts N --min-np M`: a job that failed (a rank's error, a hang kit's watch ended, a node
Slurm lost) is submitted again from its folder, where its checkpoint is, on the nodes that still answer, with its
start in KIT_RESTART, as kit's cluster restarts a job on the hosts that answer.

A node is left out when Slurm marks it unfit (down, drained, failing, or not responding: sinfo's `*`), or when its
ranks missed their heartbeats (kit's watch saw none written anew for SlurmWatch's SILENT_S) and left no exit line: a
node whose slurmd and tasks died is marked not responding by Slurm only after its SlurmdTimeout (300 s by default),
and no rank there says anything. The job is submitted again with --nodes MIN-MAX (MIN from --min-np, MAX the nodes it
had, at most those that answer) and --exclude: Slurm gives it as many nodes as it can, up to what it had.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, replace

from kit.backends.slurm import folder, jobs
from kit.backends.slurm.output import Reader
from kit.runners.base import Runner

RESTARTED = ("failed", "node_fail")  # how a job ends that kit submits again (a hang is a failure kit ended); a job
# Slurm ended for its time limit, memory or another job, or one a user cancelled, is not
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # a Slurm node name, as it reaches sbatch's command line
UNFIT = ("down", "drain", "drng", "fail", "failg", "maint", "futr", "unk")  # sinfo %t states that take no job now
REMOTE_TIMEOUT_S = 60


def parse_sinfo(text: str) -> dict[str, str]:
    """`sinfo -h -N -o '%N %t'` -> node -> its compact state (`idle`, `alloc`, `down*`, ...). Pure."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and NODE_NAME.fullmatch(words[0]):
            found[words[0]] = words[1]
    return found


def unfit(state: str) -> str | None:
    """Why a node in this sinfo state takes no job now; None when it does."""
    if state.endswith("*"):
        return "Slurm says it is not responding"
    base = state.rstrip("~#!%$@^-")
    return f"Slurm says it is {base}" if base in UNFIT else None


def node_states(runner: Runner, partition: str | None) -> dict[str, str]:
    """Every node of the job's partition (the default one when it has none), with its state now; {} when sinfo does
    not answer."""
    where = f"-p {shlex.quote(partition)} " if partition else ""
    r = runner.run(f"sinfo -h -N {where}-o '%N %t'", timeout=REMOTE_TIMEOUT_S)
    return parse_sinfo(r.stdout) if r.ok else {}


@dataclass(frozen=True)
class Again:
    """How the job starts again: the nodes left out (each with why), and --nodes LOW-HIGH."""

    left_out: dict[str, str]
    low: int
    high: int

    def options(self) -> tuple[str, ...]:
        nodes = f"--nodes={self.low}-{self.high}" if self.low != self.high else f"--nodes={self.low}"
        return (nodes, f"--exclude={','.join(sorted(self.left_out))}") if self.left_out else (nodes,)


def plan(nodes: list[str], per_node: int, min_np: int, silent: dict[str, float], ended: set[str],
         states: dict[str, str]) -> Again | str:
    """How the job that ran on `nodes` (per_node ranks each) starts again, or why it cannot. silent: node -> seconds
    since its ranks last wrote a heartbeat (each of its ranks silent); ended: the nodes one of whose ranks printed its
    exit line (they answered); states: the partition's nodes and sinfo's state of each. Pure."""
    left_out = {}
    for node in nodes:
        why = [f"its ranks wrote no heartbeat for {silent[node]:.0f} s and left no exit line"] \
            if node in silent and node not in ended else []
        if said := unfit(states.get(node, "")):
            why.append(said)
        if why:
            left_out[node] = "; ".join(why)
    answer = [n for n, state in states.items() if n not in left_out and not unfit(state)] if states else \
        [n for n in nodes if n not in left_out]
    low = max(1, math.ceil(min_np / max(per_node, 1)))
    if len(answer) < low:
        out = "; ".join(f"{n}: {why}" for n, why in left_out.items())
        return (f"{len(answer)} node(s) answer" + (f" ({', '.join(answer)})" if answer else "") +
                f" and --min-np {min_np} needs {low} ({per_node} rank(s) a node)" + (f"; left out {out}" if out else ""))
    return Again(left_out, low, min(len(nodes), len(answer)))


def ended_nodes(reader: Reader) -> set[str]:
    """The nodes one of whose ranks printed its exit line: they answered to the end."""
    return {node for rank in reader.exits if (node := reader.node_of(rank)) is not None}


def submit_again(runner: Runner, record: jobs.SlurmRecord, again: Again, variables: dict[str, str]) -> jobs.SlurmRecord:
    """The job's next start, submitted from its folder with its number as the batch script's argument (KIT_RESTART)
    and again's options; its record, saved."""
    start = record.restarts + 1
    if variables:  # (a file of this start's: the batch script of the last one removes its own as it ends)
        folder.stage_variables(runner, record.folder, record.id, start, variables)
    try:
        slurm_id = jobs.submit(runner, record.folder, list(variables), again.options(), (str(start),))
    except Exception:
        jobs.forget_variables(runner, replace(record, restarts=start))
        raise
    record = replace(record, slurm_id=slurm_id, restarts=start, earlier=(*record.earlier, record.slurm_id),
                     left_out=(*record.left_out, *sorted(again.left_out)),
                     ranks=again.high * record.per_node or record.ranks)  # (at most: as many as Slurm gives)
    jobs.save(record)
    return record
