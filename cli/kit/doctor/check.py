"""`kit doctor`: will a job start on this cluster, and if not, which host and what to fix.

Each host is read (kit.doctor.read), all at once across the hosts; then pure functions turn what was read into
findings, one per check per host (kit.doctor.judge; the Slurm checks: kit.doctor.slurm): ok, warn or fail, each warn
and fail with its fix. Nothing on a host is changed but one file of its own that the workspace check writes in the
workspace and removes again.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.doctor import slurm as doctor_slurm
from kit.cluster import state as st
from kit.config.settings import ClusterConfig, uses_gpus
from kit.doctor.judge import (FAIL, OK, WARN, Finding, decide_flavor, judge_across, judge_host, judge_pairs,
                              judge_workspace, unreachable)
from kit.doctor.network import judge_candidates, judge_rdma, judge_survey
from kit.doctor.read import read_host, read_pairs
from kit.errors import HostsFailed, KitError
from kit.cluster.fanout import fan_out
from kit.network import measure
from kit.network.measure import facts_candidates
from kit.cluster.steps import check
from kit.cluster.steps.node import Node

__all__ = ["FAIL", "OK", "WARN", "Finding", "Report", "examine"]


@dataclass
class Report:
    findings: list[Finding]
    hosts: list[str]

    @property
    def failed(self) -> int:
        return sum(f.level == FAIL for f in self.findings)

    @property
    def warned(self) -> int:
        return sum(f.level == WARN for f in self.findings)

    def of(self, host: str) -> list[Finding]:
        return [f for f in self.findings if f.host == host]


def examine(nodes: list[Node], cfg: ClusterConfig, image: str, state: st.ClusterState | None, flavor: str,
            owner, *, cuda: str | None = None, where: str = "build.flavor", slurm: bool = False) -> Report:
    """Read every host at once, then judge. `state`: the cluster as `up` recorded it (None: hosts before `up`);
    `flavor`: the image's, or auto / tf (decided from the hosts' GPUs, as `where` asks); `cuda`: the gpu flavor's
    CUDA line; `slurm`: kit.yaml has a slurm section (the Slurm section runs then, and wherever the primary has
    slurm.conf)."""
    readings = fan_out("reading the hosts", nodes, lambda n: read_host(n, cfg, image), lambda n: n.name)
    findings = unreachable(readings)
    flavor, mixed = decide_flavor(flavor, where, readings)
    findings += mixed
    up = state is not None
    for r in readings:
        if not r.error:
            findings += judge_host(r, cfg, state, uses_gpus(flavor), flavor, cuda, owner)
    findings += judge_across(readings)
    if up:
        reachable = [n for n, r in zip(nodes, readings) if not r.error and not r.container_error
                     and r.facts.container and r.facts.container.status == "running"]
        findings += _mesh(reachable, cfg.ssh_port) + _workspace(reachable, state, cfg)
        findings += _network(nodes, reachable, state)
    elif seen := [n for n, r in zip(nodes, readings) if not r.error]:
        findings += judge_candidates(facts_candidates(seen)[0]) if len(seen) > 1 else []
    findings += [f for r in readings if not r.error for f in judge_rdma(r, uses_gpus(flavor), up)]
    findings += doctor_slurm.examine(nodes, readings, slurm)
    order = {n.name: i for i, n in enumerate(nodes)}
    findings.sort(key=lambda f: order.get(f.host, len(order)))  # stable: each host's checks in the order made
    return Report(findings, [n.name for n in nodes])


def _mesh(nodes: list[Node], port: int) -> list[Finding]:
    if len(nodes) < 2:
        return []
    addresses = {n.address: n.name for n in nodes}
    seen = fan_out("SSH between the containers", nodes,
                   lambda n: read_pairs(n, [a for a in addresses if a != n.address]), lambda n: n.name)
    return judge_pairs({n.name: r for n, r in zip(nodes, seen)}, addresses, port)


def _network(nodes: list[Node], reachable: list[Node], state: st.ClusterState) -> list[Finding]:
    """The training network as kit up recorded it, and what the survey finds from the containers now."""
    if len(nodes) < 2 or state.local or len(reachable) != len(nodes):
        return []  # (a host that cannot be read has its own finding; the survey needs every container)
    recorded = measure.recorded(state)
    try:
        fresh, error = measure.survey(nodes, recorded.setting if recorded and recorded.setting else None), ""
    except KitError as e:
        fresh, error = None, str(e)
    return judge_survey([n.name for n in nodes], fresh, recorded.decision if recorded else None, error, nodes[0].name)


def _workspace(nodes: list[Node], state: st.ClusterState, cfg: ClusterConfig) -> list[Finding]:
    """With storage nfs or sshfs, a file the primary's container writes must be seen by every other container."""
    if len(nodes) < 2 or state.storage == "copy" or not nodes[0].host.primary:
        return []
    try:
        check.shared_workspace(nodes[0], nodes[1:], cfg.workspace_path)
    except HostsFailed as e:
        return judge_workspace(nodes[0].name, [n.name for n in nodes[1:]], state, cfg, e.failures)
    except KitError as e:
        return judge_workspace(nodes[0].name, [n.name for n in nodes[1:]], state, cfg, {}, e)
    return judge_workspace(nodes[0].name, [n.name for n in nodes[1:]], state, cfg, {})
