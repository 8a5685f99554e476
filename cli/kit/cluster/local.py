"""The embedded default: a cluster of N containers on this machine.

Each container stands for a host: it gets its own name, kit folder, SSH host
key and a fixed address on a private Docker network, and kit reaches "its host"
(this machine) without SSH. Everything else (keys, verification, kit run, down)
is the code that serves real hosts. The workspace is one folder on this disk,
so it is shared by every container, as with shared storage.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from ipaddress import IPv4Network

from kit.config.settings import ClusterConfig
from kit.errors import BadInput
from kit.config.hosts import Host
from kit.cluster.place import Place

# Where kit looks for a private /24 for a local cluster: a lab whose LAN or VPN routes cover one range
# (10/8 is common) still finds room in another.
POOLS = (IPv4Network("10.213.0.0/16"), IPv4Network("172.29.0.0/16"), IPv4Network("192.168.213.0/24"))
PREFIX = 24
LOCAL_NODES = 3  # the default: enough to show ranks on distinct hosts
MAX_NODES = 64


def network_name(cfg: ClusterConfig) -> str:
    return cfg.container  # kit-<name>: the network and the cluster's containers share the prefix


def node_name(i: int) -> str:
    return f"local-{i}"


def check_count(count: int) -> int:
    if not 1 <= count <= MAX_NODES:
        raise BadInput(f"--nodes: {count} is not a number of local containers from 1 to {MAX_NODES}",
                       hint="use --nodes 3, or list real hosts with --hosts hosts.txt")
    return count


def local_cluster(cfg: ClusterConfig, count: int, subnet: IPv4Network) -> tuple[list[Host], dict[str, Place]]:
    """count hosts, local-1 (the primary) to local-N, and where each one's container lives."""
    addresses = list(subnet.hosts())[1:]  # the first one is the network's gateway (this machine)
    hosts, places = [], {}
    for i in range(1, count + 1):
        host = Host(node_name(i), slots=1, primary=i == 1, local=True)
        hosts.append(host)
        places[host.name] = Place(f"{cfg.container}-{i}", f"{cfg.kit_dir}/{host.name}", network=network_name(cfg),
                                  subnet=str(subnet), address=str(addresses[i - 1]), hostname=host.name)
    return hosts, places


def routes(proc_net_route: str) -> list[IPv4Network]:
    """The destinations of this machine's IPv4 routes, from /proc/net/route (little-endian hex)."""
    found = []
    for line in proc_net_route.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        dest, mask = (socket.inet_ntoa(struct.pack("<I", int(x, 16))) for x in (cols[1], cols[7]))
        if mask != "0.0.0.0":  # the default route overlaps everything and says nothing
            found.append(IPv4Network(f"{dest}/{mask}", strict=False))
    return found


def free_subnet(taken: list[IPv4Network]) -> IPv4Network:
    """The first /24 of the pools that overlaps no route of this machine and no Docker network."""
    for pool in POOLS:
        for candidate in pool.subnets(new_prefix=PREFIX):
            if not any(candidate.overlaps(t) for t in taken):
                return candidate
    raise BadInput(f"every /24 of {', '.join(map(str, POOLS))} is in use on this machine",
                   hint="remove unused Docker networks (docker network prune)")


def docker_subnets(networks: list[dict]) -> list[IPv4Network]:
    """Subnets of Docker networks, from their `docker network inspect` attributes."""
    found = []
    for attrs in networks:
        for conf in (attrs.get("IPAM") or {}).get("Config") or []:
            try:
                found.append(ipaddress.ip_network(conf.get("Subnet", ""), strict=False))
            except ValueError:
                continue
    return [n for n in found if n.version == 4]
