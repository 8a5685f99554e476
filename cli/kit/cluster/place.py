"""Where a host's container lives: its name, kit's folder on the host, and its network.

On real hosts the container shares the host's network (`--net=host`): it is
reached at the host's address and sees the host's interfaces. In the local
cluster (several containers on one machine) each container has a fixed address
on a private Docker network instead, and sees one interface, eth0.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_NETWORK = "host"
OWNER = "owner"  # the file in kit's folder on a host that says whose cluster it is
PRIVATE_INTERFACE = "eth0"  # Docker's name for a container's only network


@dataclass(frozen=True)
class Place:
    container: str
    kit_dir: str                   # keys and job output on the host; mounted into the container
    network: str = HOST_NETWORK    # or the name of a private Docker network
    subnet: str = ""               # the private network's, e.g. 10.213.0.0/24
    address: str = ""              # the container's fixed address on it
    hostname: str = ""             # the container's host name on it

    @property
    def private(self) -> bool:
        return self.network != HOST_NETWORK

    @property
    def jobs_dir(self) -> str:
        return f"{self.kit_dir}/jobs"

    def job_dir(self, job_id: str) -> str:
        """A job's folder: its output and its record (kit.backends.cluster.records)."""
        return f"{self.jobs_dir}/{job_id}"

    @property
    def owner_file(self) -> str:
        """Whose cluster kit's folder here is (see kit.cluster.identity.Owner)."""
        return f"{self.kit_dir}/{OWNER}"

    @property
    def ssh_dir(self) -> str:
        return f"{self.kit_dir}/ssh"

    def network_options(self) -> list[str]:
        if not self.private:
            return ["--net=host"]
        return ["--network", self.network, "--ip", self.address, "--hostname", self.hostname]

    def interfaces(self) -> tuple[tuple[str, str, int], ...]:
        """What the container sees of the network when that is not the host's own (else empty)."""
        if not self.private:
            return ()
        return ((PRIVATE_INTERFACE, self.address, int(self.subnet.rsplit("/", 1)[1])),)
