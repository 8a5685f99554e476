"""A Slurm job's output file (srun --label: `TASK: text`) read as kit shows a job's: each rank's line with its node and
rank, the launcher's own lines, and which task failed first (srun's own error lines; the ranks' exit lines only
order them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from kit.jobs.commands.horovod import exit_report, split_rank

NODES_MARK = "@@kit-nodes"
_LABEL = re.compile(r"^ *(\d+): ?(.*)$")  # srun pads the task number to the width of the largest
# How srun words a task's death by a signal (strsignal's names), and the signal's number.
SIGNALS = {"Killed": 9, "Terminated": 15, "Segmentation fault": 11, "Aborted": 6, "Bus error": 7,
           "Floating point exception": 8, "Illegal instruction": 4, "Hangup": 1, "Interrupt": 2}
_SRUN_FAILED = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.*)$")


@dataclass
class Reader:
    """A Slurm job's output (srun --label: `TASK: text`) read as kit shows a job's: each rank's line with its node
    and rank, the launcher's own lines, and how the ranks ended (the rank launcher's exit lines, srun's errors)."""

    launcher: str
    ranks: int
    show: Callable[[int | None, str | None, str], None]
    nodes: list[str] = field(default_factory=list)
    exits: dict[int, tuple[int, float]] = field(default_factory=dict)   # rank -> (code, time)
    srun_errors: list[tuple[str, str, str]] = field(default_factory=list)  # (node, tasks, what)
    seen_on: dict[int, str] = field(default_factory=dict)  # torchrun: the node each rank's lines came from
    per_node: int = 0        # ranks a node: the job's ranks are counted from its nodes once they are read (a job
                             # submitted again with --nodes MIN-MAX has as many as Slurm gave it); 0: `ranks` stands

    def node_of(self, rank: int) -> str | None:
        if rank in self.seen_on or not self.nodes:
            return self.seen_on.get(rank)
        return self.nodes[min(rank * len(self.nodes) // max(self.ranks, 1), len(self.nodes) - 1)]

    @property
    def tasks(self) -> int:
        """The job's srun tasks: a rank each, or (torchrun) a node each."""
        return (len(self.nodes) or self.ranks) if self.launcher == "torchrun" else self.ranks

    def feed(self, line: str) -> None:
        labelled = _LABEL.match(line)
        if not labelled or int(labelled[1]) >= self.tasks:  # no such task: a line written into the file by hand
            self._own(line)
            return
        task, text = int(labelled[1]), labelled[2]
        if self.launcher == "torchrun":  # one task a node: its ranks' lines carry torchrun's [rank] prefix
            rank, text = split_rank(text)
            node = self.nodes[task] if task < len(self.nodes) else None
            if rank is not None and not 0 <= rank < self.ranks:
                rank = None
            if rank is not None and node is not None:
                self.seen_on[rank] = node
        else:
            rank, node = task, self.node_of(task)
        if rank is not None and (ended := exit_report(text)) is not None:
            self.exits[rank] = ended  # the last one is the rank launcher's: a line the script printed came before
            return
        self.show(rank, node, text)

    def _own(self, line: str) -> None:
        if line.startswith(NODES_MARK) and not self.nodes:  # the batch script's first line; any later one is not
            self.nodes = [pair.split("=", 1)[0] for pair in line[len(NODES_MARK):].split()]
            if self.per_node and self.nodes:
                self.ranks = len(self.nodes) * self.per_node
            return
        if failed := _SRUN_FAILED.match(line):
            self.srun_errors.append((failed[1], failed[2], failed[3]))
        self.show(None, None, line)

    def _srun_failed(self) -> list[tuple[int, str, int]]:
        """(task, node, exit code) of each task srun says failed, in srun's order (the first ended first; Slurm then
        ended the others); a task the job does not have is not one."""
        found: dict[int, tuple[str, int]] = {}
        for node, tasks, what in self.srun_errors:
            code = re.search(r"exit code (\d+)", what)
            signal = next((number for name, number in SIGNALS.items() if name in what), None)
            if not (code and int(code[1]) or signal):  # (exit code 0 is no failure, whoever wrote the line)
                continue
            for part in tasks.split(","):
                low, _, high = part.partition("-")
                for task in range(int(low), int(high or low) + 1):
                    if task < self.tasks:
                        found.setdefault(task, (node, int(code[1]) if code else 128 + signal))
        return [(task, node, code) for task, (node, code) in found.items()]

    def first_failure(self) -> Failure | None:
        """The task that failed first, as srun reports it (its exit code, its node). The ranks' own exit lines only
        order the tasks srun says failed (which of them ended first), and name the rank of a torchrun node: they are
        lines of the job's output, which the job may write whatever it likes into."""
        failed = self._srun_failed()
        if not failed:
            return None
        if self.launcher == "torchrun":
            task, node, code = failed[0]
            ranks = sorted((when, rank, own) for rank, (own, when) in self.exits.items()
                           if own != 0 and self.seen_on.get(rank) == node)  # torchrun's exit says no rank's code
            return Failure(f"rank {ranks[0][1]}", node, ranks[0][2], ranks[0][1]) if ranks else \
                Failure("torchrun", node, code, None)
        order = {task: self.exits[task][1] for task, _, _ in failed
                 if task in self.exits and self.exits[task][0] != 0}
        task, node, code = min(failed, key=lambda f: (order.get(f[0], float("inf")), failed.index(f)))
        return Failure(f"rank {task}", node, code, task)


@dataclass(frozen=True)
class Failure:
    who: str                 # "rank 3", or "torchrun" (a node's torchrun, before any rank said how it ended)
    node: str | None
    exit_code: int
    rank: int | None
