"""The cluster workflows: up, status, down. Library code: it reports through a
Progress and raises KitError; app.py prints."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from kit.cluster import state as st
from kit.jobs.commands.docker import ContainerSpec, command, network_remove_argv, remove_argv
from kit.config.cluster import KIT_ROOT, ClusterConfig
from kit.errors import BadInput, HostsFailed, KitError
from kit.image.flavors import framework, uses_gpus
from kit.cluster.fanout import fan_out
from kit.cluster.identity import Identity, Owner
from kit.config.hosts import Host
from kit.network import measure, rdma
from kit.cluster.place import Place
from kit.runners import DryRunner, Runner
from kit.cluster.steps import check, containers, distribute, image as img, keys, network, preflight, sharing, storage
from kit.cluster.steps.facts import HostFacts
from kit.cluster.steps.node import Node
from kit.cluster.steps.storage import Storage


class Progress(Protocol):
    def status(self, host: str, text: str) -> None: ...
    def transfer(self, host: str, done: int, total: int) -> None: ...


class NoProgress:
    def status(self, host: str, text: str) -> None:
        pass

    def transfer(self, host: str, done: int, total: int) -> None:
        pass


Connect = Callable[[Host], Runner]


def _nodes(hosts: list[Host], places: dict[str, Place], connect: Connect, dry_run: bool) -> list[Node]:
    return [Node(h, DryRunner(connect(h)) if dry_run else connect(h), places[h.name]) for h in hosts]


def _close(nodes: list[Node]) -> None:
    for n in nodes:
        n.runner.close()


def _name(node: Node) -> str:
    return node.name


# ---------------------------------------------------------------- up

@dataclass(frozen=True)
class Where:
    """Where `kit up` brings the cluster up: the recorded hosts (recorded set, count None), a local cluster of count
    containers (count set), or the hosts of a hosts file (neither: the caller reads it)."""

    recorded: list[Host] | None = None
    count: int | None = None


def where_to_bring_up(state: st.ClusterState | None, cluster: str, hosts_file: bool, local: bool,
                      nodes: int | None, default_count: int) -> Where:
    """Decide from the flags and the cluster's record; nothing a flag left out may remove a cluster from a host.
    Pure: raises BadInput for the cases that would replace one kind of cluster with another."""
    on_servers = state is not None and not state.local
    names = ", ".join(h.name for h in state.hosts) if state else ""
    if hosts_file and (local or nodes is not None):
        raise BadInput(f"{'--local' if local else '--nodes'} is for a cluster on this machine; --hosts lists servers",
                       hint="drop --hosts for a local cluster, or drop " + ("--local" if local else "--nodes"))
    if hosts_file:
        if state is not None and state.local:
            raise BadInput(f"cluster {cluster} runs on this machine ({len(state.hosts)} local containers); "
                           "kit up --hosts would remove them", hint=f"`kit down --name {cluster}` first, or give "
                                                                     "the servers' cluster another --name")
        return Where()
    if on_servers:
        if local or nodes is not None:
            raise BadInput(f"cluster {cluster} runs on servers ({names}); a local cluster would remove it from them",
                           hint=f"give the local cluster another --name (e.g. --name local), or `kit down --name "
                                f"{cluster}` first")
        return Where(recorded=[h.host for h in state.hosts])
    recorded = len(state.hosts) if state is not None else None
    return Where(count=nodes if nodes is not None else recorded or default_count)


# A cluster's settings that its containers run with and a flag of `kit up` may set: a later `kit up` keeps them where
# neither a flag nor kit.yaml gives them now (else a left-out --ssh-port replaced every container, and ended its jobs).
KEPT_SETTINGS = ("ssh_port", "workspace", "shm_size")


def kept_settings(state: st.ClusterState | None, cfg: ClusterConfig, given: set[str]) -> dict[str, Any]:
    """The recorded cluster's settings (KEPT_SETTINGS) that differ from cfg's and that nothing in `given` (the keys
    set by a flag or by kit.yaml) sets: its settings on servers. A local cluster's containers are made again at will."""
    if state is None or state.local:
        return {}
    recorded = {"ssh_port": state.ssh_port, "workspace": state.workspace, "shm_size": state.shm_size or None}
    now = {"ssh_port": cfg.ssh_port, "workspace": cfg.workspace_path, "shm_size": cfg.shm_size}
    return {k: v for k, v in recorded.items() if k not in given and v != now[k]}


@dataclass
class ImageChoice:
    """How `up` learns its flavor and image once it has read the hosts (build.flavor auto follows their GPUs): the
    flavor and its CUDA line from the hosts' facts; then, once every host's driver runs that line, the image."""

    flavor: Callable[[list[Node]], tuple[str, str | None]]
    image: Callable[[str, str | None], img.LocalImage]   # found, or built (flavor, CUDA line)


@dataclass
class Up:
    cfg: ClusterConfig
    choice: ImageChoice
    identity: Identity
    layers: Callable[[int], img.Layers]  # the image's config and gzip'd layers from the first one some host lacks
    connect: Connect
    places: dict[str, Place]     # host name -> where its container lives
    dry_run: bool = False
    progress: Progress = NoProgress()
    flavor: str = ""                     # chosen after the hosts are read (choice)
    image: img.LocalImage | None = None
    sent: "distribute.Sent | None" = None  # what the image step moved, for the summary
    left: list[Node] = field(default_factory=list)  # hosts no longer in hosts.txt, where kit removed the cluster
    network_where: str = "cluster.network"  # where the setting comes from (kit.yaml:LINE), for its errors
    network: measure.Decision | None = None  # the training network (measured, or as the last up recorded it)
    network_note: str = ""               # why it is not what the survey measured, where it is not

    @property
    def storage(self) -> Storage:
        return Storage.of(self.cfg)

    def run(self, hosts: list[Host]) -> list[Node]:
        nodes = _nodes(hosts, self.places, self.connect, self.dry_run)
        try:
            self._preflight(nodes)
            self._remove_left(hosts)
            if not self.dry_run:
                self._record(nodes)
            self._keys(nodes)
            self._image(nodes)
            self._workspaces(nodes)
            self._networks(nodes)
            self._export(nodes)
            # A host that mounts the shared workspace does so before its container starts (the container's
            # bind mount takes what is there then); sshfs mounts from the primary's running container.
            mounting = [n for n in nodes if self.storage.mounts(n.host.primary)]
            self._containers([n for n in nodes if n not in mounting])
            remounted = self._mounts(mounting, nodes[0].address)
            self._containers(mounting, restart=remounted)
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
        self._step("connecting", nodes, lambda n: preflight.gather(n, self.cfg, ""), "connecting")
        self.flavor, line = self.choice.flavor(nodes)
        preflight.check_drivers(nodes, self.flavor, line)  # before an image is built for a line they cannot run
        self.image = self.choice.image(self.flavor, line)
        for n in nodes:  # (the image was chosen after the hosts were read: its ID there is read from their tags)
            n.facts = replace(n.facts, image_id=n.facts.tags.get(self.image.tag))
        gpu = uses_gpus(self.flavor)
        self._step("preflight", nodes, lambda n: preflight.check(n, self.cfg, self.image.id, self.image.size, gpu,
                                                                 nodes[0].address, self.identity.owner), "checking")
        if not any(n.host.local for n in nodes):
            measure.check_setting(nodes, self.cfg.network, self.network_where)

    def _remove_left(self, hosts: list[Host]) -> None:
        """Hosts that the last up recorded and hosts.txt no longer lists: what kit made there goes first, while
        the state still knows them (a host that cannot be cleaned stops up, named, and stays recorded)."""
        old = st.load(self.identity.folder)
        names = {h.name for h in hosts}
        left = [h for h in old.hosts if h.name not in names] if old else []
        if not left:
            return
        nodes = _nodes([h.host for h in left], {h.name: h.place for h in left}, self.connect, self.dry_run)
        failures = remove_hosts(nodes, old, self.identity.owner, self.progress)
        if failures:
            raise HostsFailed("removing the cluster from hosts that left hosts.txt", failures)
        self.left = nodes

    def _record(self, nodes: list[Node]) -> None:
        """Before the first change: what kit is about to make, so `down` can undo even a half-done up."""
        old = st.load(self.identity.folder)
        hosts, s = [], self.storage
        for n in nodes:
            before = old.host(n.name) if old else None
            # What kit made at another workspace path is not what it would make now (nor remove at down).
            at_ws = before if old and old.workspace == self.cfg.workspace_path else None
            hosts.append(st.HostState(
                name=n.name, address=n.address, place=n.place, user=n.host.user, port=n.host.port,
                slots=preflight.slots(n, self.cfg, uses_gpus(self.flavor)), given_slots=n.host.slots,
                primary=n.host.primary, local=n.host.local, sudo=n.runner.sudo,
                made_workspace=(at_ws.made_workspace if at_ws else False) or self._makes_workspace(n),
                made_kit_dir=(before.made_kit_dir if before else False) or not n.facts.kit_dir_exists,
                made_mount=(at_ws.made_mount if at_ws else False) or (
                    s.mounts(n.host.primary) and not storage.mounted_here(s, n.facts.mount, nodes[0].address)),
                made_export=(at_ws.made_export if at_ws else False) or (s.exports(n.host.primary) and not n.facts.export),
                interfaces=[list(i) for i in n.place.interfaces() or n.facts.ipv4]))
        self.identity.ensure_folder()
        st.save(self.identity.folder, st.ClusterState(
            cluster=self.cfg.name, image=self.image.tag, image_id=self.image.id, ssh_port=self.cfg.ssh_port,
            workspace=self.cfg.workspace_path, hosts=hosts, checked_image_id=old.checked_image_id if old else "",
            storage=s.mode, nfs_server=s.nfs_server, flavor=self.flavor, cuda=self.image.cuda or "",
            shm_size=self.cfg.shm_size or "", network=old.network if old else {}))

    def _makes_workspace(self, n: Node) -> bool:
        """A host without the workspace folder makes it; the local cluster's one folder is the primary's to
        make (and remove)."""
        return not n.facts.workspace_exists and (n.host.primary or not n.host.local)

    def _keys(self, nodes: list[Node]) -> None:
        files = keys.cluster_files(nodes, self.cfg, self.identity)
        self._step("writing the cluster's SSH files", nodes, lambda n: keys.apply(n, files[n.name],
                                                                                  self.identity.owner), "writing keys")

    def _image(self, nodes: list[Node]) -> None:
        senders = [n for n in nodes if img.needs_image(n, self.image)]
        if senders:
            for n in senders:
                self.progress.status(n.name, "waiting for the image's layers")
            if self.dry_run:
                for n in senders:
                    n.runner.run(f"docker load  # the layers of {self.image.tag} it lacks", changes=True)
            else:
                starts = {n.name: img.present(self.image.diff_ids, n.facts.layer_chains) for n in senders}
                layers = self.layers(min(starts.values()))
                self.sent = distribute.distribute(senders, layers, starts, self.progress)
                for n in senders:
                    stream = layers.stream(starts[n.name])
                    n.changes.append(f"loaded image {self.image.tag} ({len(stream)} of its {len(layers.diff_ids)} "
                                     f"layers were missing: {sum(b.size for b in stream) / 1e6:,.0f} MB compressed)")
        img.check_same(nodes, self.image, self.dry_run)

    def _workspaces(self, nodes: list[Node]) -> None:
        self._step("making workspaces", [n for n in nodes if self._makes_workspace(n)],
                   lambda n: containers.make_workspace(n, self.cfg.workspace_path), "workspace")

    def _networks(self, nodes: list[Node]) -> None:
        """Each private network once, before any container joins it."""
        first = list({n.place.network: n for n in reversed(nodes) if n.place.private}.values())
        self._step("making networks", first, lambda n: containers.make_network(n, self.cfg.name, self.identity.owner),
                   "network")

    def _export(self, nodes: list[Node]) -> None:
        """nfs from the primary: its /etc/exports line names every other host's address."""
        s, primary = self.storage, nodes[0]
        if s.exports(primary.host.primary):
            line = storage.export_line(s, [n.address for n in nodes[1:]])
            self._step("exporting the workspace", [primary], lambda n: sharing.export(n, s, line), "NFS export")

    def _mounts(self, nodes: list[Node], primary_address: str) -> set[str]:
        """Mount the shared workspace where it is not yet; the names of the hosts where kit mounted it."""
        done = set()

        def mount(n: Node) -> None:
            if sharing.mount(n, self.storage, primary_address):
                done.add(n.name)
        self._step("mounting the workspace", nodes, mount, f"{self.storage.mode} mount")
        return done

    def _containers(self, nodes: list[Node], restart: set[str] = frozenset()) -> None:
        def start(n: Node) -> None:
            # On the host's network the container takes the host's name, which must resolve (Gloo).
            names = ((n.facts.hostname, n.address),) if n.facts.hostname and not n.place.private else ()
            spec = ContainerSpec(self.cfg, n.place, self.image.tag, self.image.id, gpus=uses_gpus(self.flavor),
                                 memlock=n.facts.memlock, add_hosts=names, owner=self.identity.owner,
                                 rdma=rdma.rdma_devices(n.facts.links) if uses_gpus(self.flavor) else ())
            if spec.memlock != "-1:-1":
                n.notes.append(f"memlock is capped at {n.facts.memlock_kb} KiB: the host does not let Docker "
                               "raise it (no CAP_SYS_RESOURCE); RDMA transports need it unlimited")
            containers.apply(n, spec, restart=n.name in restart)
        self._step("starting containers", nodes, start, "container")

    def _verify(self, nodes: list[Node]) -> None:
        for n in nodes:
            self.progress.status(n.name, "verifying SSH from the primary")
        check.ssh_mesh(nodes[0], nodes, self.cfg)
        if self.storage.shared:
            check.shared_workspace(nodes[0], nodes[1:], self.cfg.workspace_path)
        self._network(nodes)
        state = st.load(self.identity.folder)
        new_image = state.checked_image_id != self.image.id
        if new_image:  # the answer depends on the image alone
            self.progress.status(nodes[0].name, check.FRAMEWORK_CHECK[framework(self.flavor)])
            check.check_framework(nodes[0], self.flavor)
            state.checked_image_id = self.image.id
            st.save(self.identity.folder, state)
        if self.flavor == "gpu" and (new_image or any(n.changes for n in nodes)):  # the hosts' GPUs, through NCCL
            for n in nodes:
                self.progress.status(n.name, "CUDA allreduce through NCCL")
            found = check.cuda_check(nodes[0], nodes, state, self.cfg)
            for n in nodes:
                n.notes.append(found.get(n.name, "no rank reported from this host's GPUs"))
        for n in nodes:
            self.progress.status(n.name, "ready")

    def _network(self, nodes: list[Node]) -> None:
        for n in nodes:
            self.progress.status(n.name, "which network joins the hosts")
        self.network, self.network_note = network.choose(nodes, self.identity.folder, self.cfg.network)


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


def status(state: st.ClusterState, connect: Connect, owner: Owner) -> list[HostStatus]:
    def one(h: st.HostState) -> HostStatus:
        runner = connect(h.host)
        try:
            probe = Node(h.host, runner, h.place)
            preflight.gather(probe, state_cfg(state), state.image)
            f: HostFacts = probe.facts
        except KitError as e:
            return HostStatus(h.name, h.address, h.primary, reachable=False, error=e.message, slots=h.slots)
        finally:
            runner.close()
        mine = f.container and f.container.cluster == state.cluster and f.container.owner == owner
        ours = f.container if mine else None
        return HostStatus(h.name, h.address, h.primary, True, container=ours.status if ours else "missing",
                          image_matches=f.image_id == state.image_id and (ours is None or ours.image_id == state.image_id),
                          port_listening=state.ssh_port in f.listening, gpus=f.gpus, slots=h.slots)
    return fan_out("status", state.hosts, one, lambda h: h.name)


def state_cfg(state: st.ClusterState) -> ClusterConfig:
    return ClusterConfig(name=state.cluster, ssh_port=state.ssh_port, workspace=state.workspace,
                         storage=state.storage, nfs_server=state.nfs_server or None)


# ---------------------------------------------------------------- down

def removal_commands(f: HostFacts, h: st.HostState, state: st.ClusterState) -> list[tuple[str, str]]:
    """(command, what it does) to undo `up` on one host, decided from its facts. Pure."""
    q, p = shlex.quote, h.place
    plan = []
    s = Storage.of(state_cfg(state))
    if f.container is not None and f.container.cluster == state.cluster:
        plan.append((command(remove_argv(p.container)), f"removed container {p.container}"))
    if h.made_mount and f.mount is not None:  # after the container that used it
        plan.append((storage.unmount_command(s), f"unmounted {f.mount[1]} from {state.workspace}"))
    if h.made_export and f.export:
        plan.append((storage.unexport_command(s), f"removed the export of {state.workspace} from {storage.EXPORTS}"))
    if f.kit_files or f.kit_dir_exists:
        plan.append((f"rm -rf {q(p.ssh_dir)} {q(p.jobs_dir)} {q(p.owner_file)}", f"removed {p.ssh_dir} and jobs"))
    # A dead mount (sshfs ended, NFS server gone) cannot even be tested for: the folder under it is kit's all the same
    if h.made_workspace and (f.workspace_exists or h.made_mount and f.mount is not None):
        plan.append((f"rmdir {q(state.workspace)} 2>/dev/null || echo kept",
                     f"removed {state.workspace}"))
    if h.made_kit_dir and f.kit_dir_exists:
        # Up to, never including, KIT_ROOT: it is every cluster's, and may be a mountpoint. Removing a folder that
        # another mount namespace mounts something on detaches that mount there (Linux >= 3.18).
        folders = [Path(p.kit_dir), *(d for d in Path(p.kit_dir).parents
                                      if d.is_relative_to(KIT_ROOT) and d != Path(KIT_ROOT))]
        plan.append(("".join(f"rmdir {q(str(d))} 2>/dev/null; " for d in folders) + "true", f"removed {p.kit_dir}"))
    if h.primary and f.network is not None and f.network.cluster == state.cluster:  # the primary goes last
        plan.append((command(network_remove_argv(p.network)), f"removed network {p.network}"))
    return plan


def remove_from(n: Node, state: st.ClusterState, owner: Owner, progress: Progress) -> None:
    """Undo on one host what up made there for this cluster, decided from its facts."""
    progress.status(n.name, "removing")
    preflight.gather(n, state_cfg(state), state.image)
    if other := n.facts.foreign(state.cluster, owner):
        n.changes.append(f"left alone: the cluster {state.cluster} here is {other}'s, not yours")
        return
    if n.facts.docker_version is None:  # kit would see no container, and the engine would bring it back
        raise KitError(f"Docker does not answer ({n.facts.docker_error}), so kit cannot see or remove the "
                       "cluster's container, which comes back when Docker starts", host=n.name,
                       hint="start Docker on that host, then kit down again; if the host is gone for good, "
                            "kit down --force forgets it")
    for cmd, what in removal_commands(n.facts, state.host(n.name), state):
        r = n.runner.run(cmd, changes=True).check(f"`{cmd}` failed")
        n.changes.append(what if "kept" not in r.stdout else f"kept {state.workspace}: it holds files")
    progress.status(n.name, "removed")


def remove_hosts(nodes: list[Node], state: st.ClusterState, owner: Owner, progress: Progress) -> dict[str, KitError]:
    """remove_from on every node, the primary last (what the others use, the local cluster's network, goes
    after them); closes the nodes. The failures, by host."""
    failures: dict[str, KitError] = {}
    try:
        for group in ([n for n in nodes if not n.host.primary], [n for n in nodes if n.host.primary]):
            try:
                fan_out("kit down", group, lambda n: remove_from(n, state, owner, progress), _name)
            except HostsFailed as e:
                failures.update(e.failures)
    finally:
        _close(nodes)
    return failures


@dataclass
class Down:
    nodes: list[Node]
    forgotten: dict[str, KitError]  # --force: hosts kit could not clean and no longer knows


def what_may_remain(h: st.HostState) -> str:
    return (f"container {h.place.container} (restart unless-stopped, its sshd trusts the cluster's key) and "
            f"{h.place.kit_dir} (the cluster's keys)")


def down(state: st.ClusterState, identity: Identity, connect: Connect, *, dry_run: bool = False,
         force: bool = False, progress: Progress = NoProgress()) -> Down:
    """Remove what up made, host by host, from their facts. A host whose facts cannot be read (unreachable,
    Docker not answering) fails and stays in the state, keys and all, so a later `down` can finish; with
    force, such hosts are forgotten and said so."""
    nodes = _nodes([h.host for h in state.hosts], {h.name: h.place for h in state.hosts}, connect, dry_run)
    failures = remove_hosts(nodes, state, identity.owner, progress)
    if failures and not force:
        if not dry_run:  # keep only the hosts still to do, so a second `down` finishes the job
            state.hosts = [h for h in state.hosts if h.name in failures]
            st.save(identity.folder, state)
        raise HostsFailed("kit down", failures)
    if not dry_run:
        identity.remove()
    return Down(nodes, failures)
