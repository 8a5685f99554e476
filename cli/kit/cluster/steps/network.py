"""The end of `kit up` on servers: the training network, recorded in the cluster's state. Measured by the survey in
the containers (kit.network.survey), unless every host's network reads as it did when the last up measured it: then
as recorded, and a second up is fast. Hosts that share one network only train over it (the SSH check between the
containers has crossed it). A local cluster's is its private network."""

from __future__ import annotations

from pathlib import Path

from kit.cluster import state as st
from kit.errors import KitError
from kit.network import measure
from kit.network.choose import SSH, Decision, decide, unaddressed_rdma
from kit.cluster.steps.node import Node

EARLIER = "as recorded"  # the note of a choice an earlier up measured


def choose(nodes: list[Node], folder: Path, setting: str | None) -> tuple[Decision, str]:
    """(the training network, a note where it is not what a survey measured now: EARLIER where an earlier one did)."""
    state, note = st.load(folder), ""
    if all(n.host.local for n in nodes):
        decision, stamp = measure.local_decision(state.hosts), ""
    else:
        stamp, old = measure.fingerprint(nodes, setting), measure.recorded(state)
        if old is not None and old.fingerprint == stamp:
            return old.decision, EARLIER
        found, notes = measure.facts_candidates(nodes)
        ssh = next(c for c in found if c.ssh)
        if ssh.joins and (setting == SSH or setting is None and not [c for c in found if c.members and c is not ssh]):
            decision = decide(found, SSH, notes)  # the SSH check between the containers crossed it
            decision.how = "cluster.network: ssh" if setting else "the only network the hosts share"
            decision.warnings += unaddressed_rdma({n.name: n.facts.links for n in nodes}, decision)
        else:
            try:
                decision = measure.survey(nodes, setting)
            except KitError as e:
                if setting or not ssh.joins:
                    raise
                decision, stamp = decide(found, SSH, notes), ""  # measured again at the next up
                decision.how = "not measured: the survey failed"
                note = f"the network survey failed ({e}); training over the hosts.txt network"
    measure.record(state, decision, stamp, setting)
    st.save(folder, state)
    return decision, note
