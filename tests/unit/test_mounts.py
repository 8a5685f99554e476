"""cluster.mounts: host folders in every container, checked in kit.yaml, in the container's spec and at preflight."""

import subprocess
from dataclasses import replace
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from kit.jobs.commands.docker import ContainerSpec, run_argv
from kit.config.cluster import Mount
from kit.config.settings import ClusterConfig, cluster_config, read_config
from kit.errors import BadInput
from kit.cluster.identity import Owner
from kit.config.hosts import Host
from kit.cluster.local import local_cluster
from kit.cluster.steps import containers, preflight
from kit.cluster.steps.facts import ContainerFacts, HostFacts, facts_command, parse_facts
from kit.cluster.steps.node import Node


def mounts(tmp_path: Path, *entries: str, extra: str = "") -> ClusterConfig:
    path = tmp_path / "kit.yaml"
    path.write_text("cluster:\n  name: lab\n" + extra + "  mounts:\n" + "".join(f"    - {e}\n" for e in entries))
    return cluster_config(read_config(path), {})


def test_entries_are_read_in_dockers_v_form_read_only_unless_rw(tmp_path):
    cfg = mounts(tmp_path, "/data/imagenet:/data/imagenet", "/srv//ckpt/:/ckpt:rw", "/mnt/nfs/corpus:/corpus:ro")
    assert cfg.mounts == ("/data/imagenet:/data/imagenet:ro", "/srv/ckpt:/ckpt:rw", "/mnt/nfs/corpus:/corpus:ro")
    assert cfg.bind_mounts == (Mount("/data/imagenet", "/data/imagenet"), Mount("/srv/ckpt", "/ckpt", True),
                               Mount("/mnt/nfs/corpus", "/corpus"))
    assert ClusterConfig().mounts == () and ClusterConfig().bind_mounts == ()


# (entry, what the message says after `kit.yaml:LINE: cluster.mounts: `)
BAD = [
    ("/data", "'/data' is not HOST_PATH:CONTAINER_PATH[:ro|:rw]"),
    ("/data:/data:rx", "'/data:/data:rx' is not HOST_PATH:CONTAINER_PATH[:ro|:rw]"),
    ("/a:/b:ro:rw", "'/a:/b:ro:rw' is not HOST_PATH:CONTAINER_PATH[:ro|:rw]"),
    ("data:/data", "the host path 'data' is not an absolute path"),
    ("/data/x:data", "the container path 'data' is not an absolute path"),
    ("'/data/$(reboot):/d'", "the host path '/data/$(reboot)' is not an absolute path"),
    ("'/data/a b:/d'", "the host path '/data/a b' is not an absolute path"),
    ("/data/../etc:/d", "the host path '/data/../etc' is not an absolute path"),
    ("/etc:/cfg", "'/etc:/cfg': the host path /etc is a system folder"),
    ("/etc/ssl:/certs", "'/etc/ssl:/certs': the host path /etc/ssl is a system folder"),
    ("/root/.ssh:/keys", "the host path /root/.ssh is a system folder"),
    ("/:/host", "the host path / is a system folder"),
    ("/home:/home2", "the host path /home is a system folder"),
    ("/var/lib/docker/volumes:/v", "the host path /var/lib/docker/volumes is a system folder"),
    ("/var/lib/kit/other/ssh:/k", "the host path /var/lib/kit/other/ssh is inside kit's own folders"),
    ("/data/x:/etc/x", "the container path /etc/x is a folder of the image's system or of kit's"),
    ("/data/x:/usr/local", "the container path /usr/local is a folder of the image's system or of kit's"),
    ("/data/x:/proc", "the container path /proc is a folder"),
    ("/data/x:/var/lib/kit/lab/jobs", "the container path /var/lib/kit/lab/jobs is a folder"),
    ("/data/x:/opt/venv/lib", "the container path /opt/venv/lib is a folder"),
    ("/data/x:/", "the container path / is a folder"),
    ("/data/x:/tmp", "the container path /tmp is a folder"),
    ("/data/x:/var/lib/kit/lab/workspace/d", "the container path /var/lib/kit/lab/workspace/d is a folder"),
]


@pytest.mark.parametrize("entry, message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_entry_is_named_with_its_line_and_the_form(tmp_path, entry, message):
    with pytest.raises(BadInput) as e:
        mounts(tmp_path, "/data/ok:/ok", entry)
    text = str(e.value).replace(str(tmp_path) + "/", "")
    assert text.startswith("kit.yaml:3: cluster.mounts: ") and message in text, text
    assert "HOST_PATH:CONTAINER_PATH[:ro|:rw]" in e.value.hint and e.value.exit_code == 2


def test_the_container_path_is_never_over_the_workspace(tmp_path):
    extra = "  workspace: /srv/kit/ws\n"
    for entry in ("/data/x:/srv/kit/ws", "/data/x:/srv/kit/ws/data", "/data/x:/srv/kit", "/data/x:/srv"):
        with pytest.raises(BadInput, match="is over the workspace /srv/kit/ws"):
            mounts(tmp_path, entry, extra=extra)
    assert mounts(tmp_path, "/data/x:/srv/kit/data", extra=extra).mounts == ("/data/x:/srv/kit/data:ro",)


def test_two_entries_at_one_container_path_are_refused(tmp_path):
    with pytest.raises(BadInput, match="two entries mount at the container path /data"):
        mounts(tmp_path, "/data/a:/data", "/data/b:/data/")


def test_a_single_string_is_not_a_list(tmp_path):
    path = tmp_path / "kit.yaml"
    path.write_text("cluster:\n  mounts: /data/a:/data\n")
    with pytest.raises(BadInput, match=r"kit.yaml:2: cluster.mounts: should be a list"):
        cluster_config(read_config(path), {})


def spec(cfg: ClusterConfig, place=None) -> ContainerSpec:
    return ContainerSpec(cfg, place or cfg.host_place(), "img:1", "sha256:abc", gpus=False)


def test_the_container_mounts_each_folder_and_its_spec_changes_with_them():
    plain = ClusterConfig(name="lab")
    cfg = ClusterConfig(name="lab", mounts=("/data/imagenet:/data", "/srv/out:/out:rw"))
    argv = run_argv(spec(cfg))
    ws = argv.index("/var/lib/kit/lab/workspace:/var/lib/kit/lab/workspace")
    assert argv[ws + 1:ws + 5] == ["--mount", "type=bind,source=/data/imagenet,target=/data,readonly",
                                   "--mount", "type=bind,source=/srv/out,target=/out"]
    assert "--mount" not in run_argv(spec(plain))
    assert spec(cfg).digest != spec(plain).digest  # a change of mounts makes the container anew
    assert spec(cfg).digest == spec(ClusterConfig(name="lab", mounts=("/data/imagenet:/data:ro", "/srv/out:/out:rw"))
                                     ).digest  # the same mounts, written otherwise: the same container
    assert spec(ClusterConfig(name="lab", mounts=("/data/imagenet:/data:rw",))).digest != \
        spec(ClusterConfig(name="lab", mounts=("/data/imagenet:/data",))).digest


def test_the_local_clusters_containers_mount_them_too():
    cfg = ClusterConfig(name="demo", mounts=("/data/imagenet:/data",))
    _, places = local_cluster(cfg, 2, IPv4Network("10.213.4.0/24"))
    for place in places.values():
        argv = run_argv(spec(cfg, place))
        assert argv[argv.index("--mount") + 1] == "type=bind,source=/data/imagenet,target=/data,readonly"


class Recording:
    host, sudo = "h1", False

    def __init__(self):
        self.commands = []

    def run(self, command, changes=False, **kw):
        from kit.runners.base import Result
        self.commands.append(command)
        return Result("h1", command, 0)


def test_an_unchanged_container_is_left_alone_and_a_changed_mount_makes_it_anew():
    cfg = ClusterConfig(name="lab", mounts=("/data/imagenet:/data",))
    me = Owner("a" * 32, "me")
    s = replace(spec(cfg), owner=me)
    have = ContainerFacts("running", "sha256:abc", s.digest, "lab", me)
    node = Node(Host("h1"), Recording(), cfg.host_place(), facts=HostFacts(uid=0, docker_version="24", container=have))
    containers.apply(node, s)
    assert node.runner.commands == [] and node.changes == []
    moved = replace(s, cluster=ClusterConfig(name="lab", mounts=("/data/imagenet:/imagenet",)))
    containers.apply(node, moved)
    assert node.runner.commands[0] == "docker rm -f kit-lab" and node.runner.commands[1].startswith("docker run")
    assert "target=/imagenet,readonly" in node.runner.commands[1]


def test_the_facts_script_finds_which_host_paths_are_folders(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "file").write_text("x")
    sources = (str(tmp_path / "data"), str(tmp_path / "file"), str(tmp_path / "missing"))
    script = facts_command("img:1", ClusterConfig(name="lab").host_place(), "/w", "lab", sources)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60).stdout
    assert parse_facts(0, out).sources == {str(tmp_path / "data"): "folder", str(tmp_path / "file"): "other"}
    assert "@@kit sources" not in facts_command("img:1", ClusterConfig().host_place(), "/w", "lab")


def test_preflight_names_each_missing_host_path_and_the_fix():
    cfg = ClusterConfig(name="lab", mounts=("/data/imagenet:/data", "/srv/ckpt:/ckpt:rw", "/data/ok:/ok"))
    facts = HostFacts(uid=0, docker_version="24.0", free_bytes=100 << 30,
                      sources={"/srv/ckpt": "other", "/data/ok": "folder"})
    node = Node(Host("gpu7"), None, cfg.host_place(), facts=facts)
    found = preflight.problems(node, cfg, "sha256:1", 1 << 30, False, "10.0.0.1", Owner("me", "me"))
    assert found == ["cluster.mounts: /data/imagenet does not exist (to be mounted at /data)",
                     "cluster.mounts: /srv/ckpt is not a folder (to be mounted at /ckpt)"]
    assert "make the folder on that host" in preflight.hint_for(found) and "cluster.mounts" in preflight.hint_for(found)
    with pytest.raises(Exception) as e:
        preflight.check(node, cfg, "sha256:1", 1 << 30, False, "10.0.0.1", Owner("me", "me"))
    assert str(e.value).startswith("gpu7: cluster.mounts: /data/imagenet does not exist")
    ok = replace(node, facts=replace(facts, sources={p: "folder" for p in ("/data/imagenet", "/srv/ckpt", "/data/ok")}))
    assert preflight.problems(ok, cfg, "sha256:1", 1 << 30, False, "10.0.0.1", Owner("me", "me")) == []
