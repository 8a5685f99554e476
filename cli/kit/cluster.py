"""The cluster workflows: up, status, down. Library code: it reports through a
Progress and raises KitError; app.py prints."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from kit import state as st
from kit.commands.docker import ContainerSpec, command, remove_argv
from kit.config import ClusterConfig
from kit.errors import HostsFailed, KitError
from kit.fanout import fan_out
from kit.identity import Identity
from kit.inventory import Host
from kit.runners import DryRunner, Runner
from kit.steps import check, containers, image as img, keys, preflight
from kit.steps.facts import HostFacts
from kit.steps.node import Node


class Progress(Protocol):
    def status(self, host: str, text: str) -> None: ...
    def transfer(self, host: str, done: int, total: int) -> None: ...


class NoProgress:
    def status(self, host: str, text: str) -> None:
        pass

    def transfer(self, host: str, done: int, total: int) -> None:
        pass


Connect = Callable[[Host], Runner]


def _nodes(hosts: list[Host], connect: Connect, dry_run: bool) -> list[Node]:
    return [Node(h, DryRunner(connect(h)) if dry_run else connect(h)) for h in hosts]


def recorded_nodes(hosts: list[st.HostState], connect: Connect) -> list[Node]:
    """Hosts that `up` recorded, connected and running as root, at the addresses it recorded."""
    nodes = [Node(h.host, connect(h.host), address=h.address) for h in hosts]
    fan_out("connecting", nodes, preflight.become_root, _name)
    return nodes


def _close(nodes: list[Node]) -> None:
    for n in nodes:
        n.runner.close()


def _name(node: Node) -> str:
    return node.name


# ---------------------------------------------------------------- up

@dataclass(frozen=True)
class Copied:
    hosts: int
    compressed_bytes: int
    image_bytes: int
    seconds: float

    def __str__(self) -> str:
        return (f"copied the image ({self.image_bytes / 1e9:.2f} GB, {self.compressed_bytes / 1e6:,.0f} MB "
                f"compressed) to {self.hosts} host{'s' if self.hosts > 1 else ''} in {self.seconds:.1f} s")


@dataclass
class Up:
    cfg: ClusterConfig
    flavor: str
    image: img.LocalImage
    identity: Identity
    archive: Callable[[], Path]  # makes (or finds) the compressed image
    connect: Connect
    dry_run: bool = False
    progress: Progress = NoProgress()
    copied: "Copied | None" = None  # what the image step sent, for the summary

    def run(self, hosts: list[Host]) -> list[Node]:
        nodes = _nodes(hosts, self.connect, self.dry_run)
        try:
            self._preflight(nodes)
            if not self.dry_run:
                self._record(nodes)
            self._keys(nodes)
            self._image(nodes)
            self._containers(nodes)
            if not self.dry_run:
                self._verify(nodes)
        finally:
            _close(nodes)
        return nodes

    def _step(self, what: str, nodes: list[Node], fn: Callable[[Node], None], status: str) -> None:
        def one(n: Node) -> None:
            self.progress.status(n.name, status)
            fn(n)
        fan_out(what, nodes, one, _name)

    def _preflight(self, nodes: list[Node]) -> None:
        gpu = self.flavor == "gpu"
        self._step("connecting", nodes, lambda n: preflight.gather(n, self.cfg, self.image.tag), "connecting")
        self._step("preflight", nodes, lambda n: preflight.check(n, self.cfg, self.image.id, self.image.size, gpu),
                   "checking")

    def _record(self, nodes: list[Node]) -> None:
        """Before the first change: what kit is about to make, so `down` can undo even a half-done up."""
        old = st.load(self.identity.folder)
        hosts = []
        for n in nodes:
            before = old.host(n.name) if old else None
            hosts.append(st.HostState(
                name=n.name, address=n.address, user=n.host.user, port=n.host.port,
                slots=preflight.slots(n, self.cfg, self.flavor == "gpu"),
                primary=n.host.primary,
                made_workspace=(before.made_workspace if before else False) or not n.facts.workspace_exists,
                made_kit_dir=(before.made_kit_dir if before else False) or not n.facts.kit_dir_exists,
                interfaces=[list(i) for i in n.facts.ipv4]))
        self.identity.ensure_folder()
        st.save(self.identity.folder, st.ClusterState(
            cluster=self.cfg.name, image=self.image.tag, image_id=self.image.id, ssh_port=self.cfg.ssh_port,
            container=self.cfg.container, kit_dir=self.cfg.kit_dir, workspace=self.cfg.workspace_path, hosts=hosts,
            checked_image_id=old.checked_image_id if old else ""))

    def _keys(self, nodes: list[Node]) -> None:
        files = keys.cluster_files(nodes, self.cfg, self.identity)
        self._step("writing the cluster's SSH files", nodes, lambda n: keys.apply(n, self.cfg, files[n.name]),
                   "writing keys")

    def _image(self, nodes: list[Node]) -> None:
        senders = [n for n in nodes if img.needs_image(n, self.image)]
        if senders:
            for n in senders:
                self.progress.status(n.name, "waiting for the image archive")
            path = Path("/dev/null") if self.dry_run else self.archive()
            total = path.stat().st_size
            started = time.monotonic()

            def send(n: Node) -> None:
                sent = 0

                def on_bytes(count: int) -> None:
                    nonlocal sent
                    sent += count
                    self.progress.transfer(n.name, sent, total)
                img.send(n, self.image, path, on_bytes)
            self._step("copying the image", senders, send, "copying the image")
            self.copied = Copied(len(senders), total, self.image.size, time.monotonic() - started)
        img.check_same(nodes, self.image, self.dry_run)

    def _containers(self, nodes: list[Node]) -> None:
        def start(n: Node) -> None:
            spec = ContainerSpec(self.cfg, self.image.tag, self.image.id, gpus=self.flavor == "gpu",
                                 memlock=n.facts.memlock,
                                 add_hosts=((n.facts.hostname, n.address),) if n.facts.hostname else ())
            if spec.memlock != "-1:-1":
                n.notes.append(f"memlock is capped at {n.facts.memlock_kb} KiB: the host does not let Docker "
                               "raise it (no CAP_SYS_RESOURCE); RDMA transports need it unlimited")
            containers.apply(n, spec)
        self._step("starting containers", nodes, start, "container")

    def _verify(self, nodes: list[Node]) -> None:
        for n in nodes:
            self.progress.status(n.name, "verifying SSH from the primary")
        check.ssh_mesh(nodes[0], nodes, self.cfg)
        state = st.load(self.identity.folder)
        if state.checked_image_id != self.image.id:  # the answer depends on the image alone
            self.progress.status(nodes[0].name, "horovodrun --check-build")
            check.check_build(nodes[0], self.cfg, self.flavor)
            state.checked_image_id = self.image.id
            st.save(self.identity.folder, state)
        for n in nodes:
            self.progress.status(n.name, "ready")


# ---------------------------------------------------------------- status

@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    primary: bool
    reachable: bool
    error: str = ""
    container: str = "missing"
    image_matches: bool = False
    port_listening: bool = False
    gpus: int = 0
    slots: int | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def status(state: st.ClusterState, connect: Connect) -> list[HostStatus]:
    def one(h: st.HostState) -> HostStatus:
        runner = connect(h.host)
        try:
            probe = Node(h.host, runner)
            preflight.gather(probe, _state_cfg(state), state.image)
            f: HostFacts = probe.facts
        except KitError as e:
            return HostStatus(h.name, h.address, h.primary, reachable=False, error=e.message, slots=h.slots)
        finally:
            runner.close()
        ours = f.container if f.container and f.container.cluster == state.cluster else None
        return HostStatus(h.name, h.address, h.primary, True, container=ours.status if ours else "missing",
                          image_matches=f.image_id == state.image_id and (ours is None or ours.image_id == state.image_id),
                          port_listening=state.ssh_port in f.listening, gpus=f.gpus, slots=h.slots)
    return fan_out("status", state.hosts, one, lambda h: h.name)


def _state_cfg(state: st.ClusterState) -> ClusterConfig:
    return ClusterConfig(name=state.cluster, ssh_port=state.ssh_port, workspace=state.workspace)


# ---------------------------------------------------------------- down

def removal_commands(f: HostFacts, h: st.HostState, state: st.ClusterState) -> list[tuple[str, str]]:
    """(command, what it does) to undo `up` on one host, decided from its facts. Pure."""
    q = shlex.quote
    plan = []
    if f.container is not None and f.container.cluster == state.cluster:
        plan.append((command(remove_argv(state.container)), f"removed container {state.container}"))
    if f.kit_files or f.kit_dir_exists:
        plan.append((f"rm -rf {q(state.kit_dir + '/ssh')} {q(state.kit_dir + '/jobs')}",
                     f"removed {state.kit_dir}/ssh and jobs"))
    if h.made_workspace and f.workspace_exists:
        plan.append((f"rmdir {q(state.workspace)} 2>/dev/null || echo kept",
                     f"removed {state.workspace}"))
    if h.made_kit_dir and f.kit_dir_exists:
        plan.append((f"rmdir {q(state.kit_dir)} 2>/dev/null; rmdir {q(str(Path(state.kit_dir).parent))} "
                     f"2>/dev/null; true", f"removed {state.kit_dir}"))
    return plan


def down(state: st.ClusterState, identity: Identity, connect: Connect, *, dry_run: bool = False,
         progress: Progress = NoProgress()) -> list[Node]:
    nodes = _nodes([h.host for h in state.hosts], connect, dry_run)
    cfg = _state_cfg(state)

    def remove(n: Node) -> None:
        progress.status(n.name, "removing")
        preflight.gather(n, cfg, state.image)
        for cmd, what in removal_commands(n.facts, state.host(n.name), state):
            r = n.runner.run(cmd, changes=True).check(f"`{cmd}` failed")
            n.changes.append(what if "kept" not in r.stdout else f"kept {state.workspace}: it holds files")
        progress.status(n.name, "removed")
    try:
        fan_out("kit down", nodes, remove, _name)
    except HostsFailed as e:
        if not dry_run:  # keep only the hosts still to do, so a second `down` finishes the job
            state.hosts = [h for h in state.hosts if h.name in e.failures]
            st.save(identity.folder, state)
        raise
    finally:
        _close(nodes)
    if not dry_run:
        identity.remove()
    return nodes
