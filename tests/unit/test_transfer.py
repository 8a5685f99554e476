"""`kit cp` and `kit exec`'s byte path: what the user typed, and an untrusted tar stream unpacked for real (through
LocalRunner's Reading) with nothing landing outside the destination; the container's scripts run in sh here."""

import hashlib
import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from kit.data import cpargs
from kit.data import transfer
from kit.data import untar
from kit.errors import BadInput, KitError
from kit.cluster.place import Place
from kit.runners.local import LocalRunner
from kit.cluster.state import HostState
from kit.data.cpargs import Local, Remote
from kit.data.untar import Target

WS = "/var/lib/kit/lab/workspace"
HOSTS = [HostState("gpu-1", "10.0.0.1", Place("kit-lab", "/var/lib/kit/lab"), primary=True),
         HostState("gpu-2", "10.0.0.2", Place("kit-lab", "/var/lib/kit/lab"))]


# ---------------------------------------------------------------- what the user typed

def test_host_path_by_name_or_address_relative_to_the_workspace_or_absolute_inside_it():
    src, dest = cpargs.endpoints("gpu-2:checkpoints/model.pt", "out/", HOSTS, WS)
    assert (src.host.name, src.path, src.contents) == ("gpu-2", f"{WS}/checkpoints/model.pt", False)
    assert dest == Local(Path("out/"), "out/", False)
    src, dest = cpargs.endpoints("data", "10.0.0.1:", HOSTS, WS)
    assert src == Local(Path("data"), "data", False) and (dest.host.name, dest.path) == ("gpu-1", WS)
    src, _ = cpargs.endpoints(f"gpu-1:{WS}/runs/./a//b/.", ".", HOSTS, WS)
    assert (src.path, src.contents) == (f"{WS}/runs/a/b", True)
    src, dest = cpargs.endpoints("./a:b", "gpu-1:x", HOSTS, WS)  # a colon in a local path: ./ first, as docker cp
    assert src == Local(Path("a:b"), "./a:b", False) and dest.path == f"{WS}/x"


@pytest.mark.parametrize("src, dest, message, fix", [
    ("gpu-9:ckpt.pt", ".", "gpu-9:ckpt.pt: gpu-9 is not a host of the cluster", "gpu-1, gpu-2"),
    ("a", "b", "kit cp a b: one of them must be on a host of the cluster", "HOST:PATH"),
    ("gpu-1:a", "gpu-2:b", "kit cp gpu-1:a gpu-2:b: one of them must be on a host", "HOST:PATH"),
    ("gpu-1:../jobs/x", ".", f"gpu-1:../jobs/x: /var/lib/kit/lab/jobs/x is outside the cluster's workspace {WS}",
     "relative to the workspace"),
    ("gpu-1:/etc/passwd", ".", "gpu-1:/etc/passwd: /etc/passwd is outside the cluster's workspace", "HOST:"),
    (".", f"gpu-1:{WS}/../ssh", f"gpu-1:{WS}/../ssh: /var/lib/kit/lab/ssh is outside", "HOST:"),
    (".", f"gpu-1:{WS}2/x", f"gpu-1:{WS}2/x: {WS}2/x is outside", "HOST:"),
])
def test_bad_input_is_named_with_the_fix(src, dest, message, fix):
    with pytest.raises(BadInput) as e:
        cpargs.endpoints(src, dest, HOSTS, WS)
    assert str(e.value).startswith(message) and fix in e.value.hint and e.value.exit_code == 2


def test_where_a_copy_lands_here_follows_docker_cp(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    here = lambda s: Local(Path(s), s, s.endswith("/."))  # noqa: E731
    assert cpargs.local_target(here(f"{tmp_path}/dir"), "ckpt", False) == Target(tmp_path / "dir", "ckpt")
    assert cpargs.local_target(here(f"{tmp_path}/dir"), "ckpt", True) == Target(tmp_path / "dir", "")
    assert cpargs.local_target(here(f"{tmp_path}/new"), "ckpt", False) == Target(tmp_path, "new")
    assert cpargs.local_target(here(f"{tmp_path}/file"), "ckpt", False) == Target(tmp_path, "file", onto_file=True)
    for dest, message in ((f"{tmp_path}/new/", "no such folder"), (f"{tmp_path}/no/new", "does not exist")):
        with pytest.raises(BadInput, match=message):
            cpargs.local_target(here(dest), "ckpt", False)
    with pytest.raises(BadInput, match="contents go into a folder"):
        cpargs.local_target(here(f"{tmp_path}/file"), "ckpt", True)


# ---------------------------------------------------------------- a hostile tar stream

def member(tar, name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", mtime=0):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.size, info.mtime = kind, mode, link, len(data), mtime
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    tar.addfile(info, io.BytesIO(data) if data else None)


def hostile_tar(path: Path) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        member(tar, "ckpt", tarfile.DIRTYPE, mode=0o7777)
        member(tar, "ckpt/model.pt", data=b"weights\0\r\n", mode=0o4755)       # setuid: dropped
        member(tar, "ckpt/when.txt", data=b"t", mtime=1 << 70)                 # a time no file can have
        member(tar, "ckpt/sub/deep.txt", data=b"deep")                          # its folder comes later
        member(tar, "ckpt/sub", tarfile.DIRTYPE, mode=0o755)
        member(tar, "../evil", data=b"x")
        member(tar, "/tmp/kit-evil-abs", data=b"x")
        member(tar, "ckpt/../../evil2", data=b"x")
        member(tar, "ckpt/etc", tarfile.SYMTYPE, link="/etc")                  # absolute link
        member(tar, "ckpt/up", tarfile.SYMTYPE, link="../../outside")          # a link out of the copy
        member(tar, "ckpt/up/planted", data=b"x")                               # ... and through it
        member(tar, "ckpt/latest", tarfile.SYMTYPE, link="model.pt")           # a link inside: kept
        member(tar, "ckpt/self", tarfile.SYMTYPE, link=".")                    # to the copy's own folder: kept
        member(tar, "ckpt/via", tarfile.SYMTYPE, link="self/../../outside")    # out, through a link: refused
        member(tar, "ckpt/later", tarfile.SYMTYPE, link="soon/../..")          # its first step a link made after it
        member(tar, "ckpt/soon", tarfile.SYMTYPE, link="sub")
        member(tar, "ckpt/null", tarfile.CHRTYPE)                               # a device
        member(tar, "ckpt/fifo", tarfile.FIFOTYPE)
        member(tar, "ckpt/hard", tarfile.LNKTYPE, link="/etc/passwd")          # a hard link out
        member(tar, "ckpt/same", tarfile.LNKTYPE, link="ckpt/model.pt")        # a hard link inside: kept
        member(tar, "ckpt/pre/x", data=b"x")                                    # through a link that was here
    return path


def test_a_hostile_stream_lands_nothing_outside_the_destination(tmp_path):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "ckpt").mkdir()
    (dest / "ckpt" / "pre").symlink_to(outside)  # the user's own link, in the way
    tar = hostile_tar(tmp_path / "h.tar")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    stream = LocalRunner("h").read_out(f"cat {tar}", 10)
    done = untar.unpack(stream, Target(dest, "ckpt"), host="h")
    assert stream.result().ok
    left = dict(done.left_out)
    assert left == {
        "../evil": "a name with ..", "/tmp/kit-evil-abs": "an absolute name", "ckpt/../../evil2": "a name with ..",
        "ckpt/etc": "a link out of the copy (to /etc)", "ckpt/up": "a link out of the copy (to ../../outside)",
        "ckpt/via": "a link out of the copy (to self/../../outside)",
        "ckpt/later": "a link out of the copy (to soon/../..)",
        "ckpt/null": "a device, fifo or socket", "ckpt/fifo": "a device, fifo or socket",
        "ckpt/hard": "a hard link to what is not a file of the copy (/etc/passwd)",
        "ckpt/pre/x": "a link or a file is in its way here"}
    assert list(outside.iterdir()) == [] and not (tmp_path / "evil").exists() and not Path("/tmp/kit-evil-abs").exists()
    after = sorted(str(p) for p in tmp_path.rglob("*") if not str(p).startswith(str(dest)))
    assert after == [p for p in before if not p.startswith(str(dest))]
    ckpt = dest / "ckpt"
    assert (ckpt / "model.pt").read_bytes() == b"weights\0\r\n" and (ckpt / "sub" / "deep.txt").read_text() == "deep"
    assert stat.S_IMODE((ckpt / "model.pt").stat().st_mode) == 0o755  # no setuid bit
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(ckpt.stat().st_mode) == 0o777 & ~umask  # no setgid or sticky bit; as the umask allows
    assert os.readlink(ckpt / "latest") == "model.pt" and os.readlink(ckpt / "self") == "."
    assert os.readlink(ckpt / "soon") == "sub"
    assert (ckpt / "same").stat().st_ino == (ckpt / "model.pt").stat().st_ino
    assert (ckpt / "up").is_dir() and not (ckpt / "up").is_symlink()  # made as a folder for planted; no link there
    assert (ckpt / "when.txt").read_bytes() == b"t" and (done.files, done.links) == (5, 3)


@pytest.mark.parametrize("umask, folder, file", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_the_modes_that_came_are_cut_by_the_users_umask(tmp_path, umask, folder, file):
    """A job makes its outputs writable by everyone (0777, 0666): on this machine, which other people may use, they
    land as tar lands them for a user, within the umask; an existing folder of the copy's name is not opened up."""
    tar = tmp_path / "h.tar"
    with tarfile.open(tar, "w") as t:
        member(t, "ckpt", tarfile.DIRTYPE, mode=0o777)
        member(t, "ckpt/sub", tarfile.DIRTYPE, mode=0o777)
        member(t, "ckpt/model.pt", data=b"w", mode=0o666)
    dest = tmp_path / "dest"
    (dest / "ckpt").mkdir(parents=True, mode=0o700)
    before = os.umask(umask)
    try:
        untar.unpack(LocalRunner("h").read_out(f"cat {tar}", 10), Target(dest, "ckpt"))
    finally:
        os.umask(before)
    modes = [stat.S_IMODE((dest / p).stat().st_mode) for p in ("ckpt", "ckpt/sub", "ckpt/model.pt")]
    assert modes == [folder, folder, file]


def test_a_folder_onto_a_file_is_refused_and_a_file_replaces_a_link_without_writing_through_it(tmp_path):
    tar = tmp_path / "h.tar"
    with tarfile.open(tar, "w") as t:
        member(t, "ckpt", tarfile.DIRTYPE)
        member(t, "ckpt/a", data=b"a")
    (tmp_path / "file").write_text("mine")
    with pytest.raises(BadInput, match="is a file: a folder cannot be copied onto it"):
        untar.unpack(LocalRunner("h").read_out(f"cat {tar}", 10), Target(tmp_path, "file", onto_file=True))
    assert (tmp_path / "file").read_text() == "mine"
    with tarfile.open(tar, "w") as t:
        member(t, "model.pt", data=b"new")
    (tmp_path / "secret").write_text("keep")
    (tmp_path / "model.pt").symlink_to(tmp_path / "secret")
    untar.unpack(LocalRunner("h").read_out(f"cat {tar}", 10), Target(tmp_path, "model.pt", onto_file=True))
    assert (tmp_path / "secret").read_text() == "keep" and (tmp_path / "model.pt").read_bytes() == b"new"
    assert not (tmp_path / "model.pt").is_symlink()


class Endless:
    """A stream that a container's tar could send, made as it is read: a header, then the same block on and on."""

    def __init__(self, header: bytes, block: bytes = b"\0" * 512) -> None:
        self.buf, self.block, self.sent = header, block, 0

    def read(self, size: int = -1) -> bytes:
        size = size if size > 0 else 1 << 16
        while len(self.buf) < size:
            self.buf += self.block * 256
        out, self.buf = self.buf[:size], self.buf[size:]
        self.sent += len(out)
        return out


def test_a_long_name_or_pax_header_is_refused_before_it_is_read_into_memory(tmp_path):
    """tarfile reads a GNU long name or a pax header whole before kit sees its member: one that says it holds 64 MiB
    (and a stream that sends it) is refused at its header."""
    for kind in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE):
        info = tarfile.TarInfo("././@LongLink")
        info.type, info.size = kind, 64 << 20
        stream = Endless(info.tobuf(tarfile.GNU_FORMAT), b"a" * 512)
        with pytest.raises(KitError, match="not a whole tar stream .*a header of 67108864 bytes"):
            untar.unpack(stream, Target(tmp_path, "x"), host="h")
        assert stream.sent < 1 << 20


def test_a_stream_of_members_left_out_is_not_held_in_memory(tmp_path):
    """Devices, over and over (a stream has no end kit can trust): kit names the first it left out and counts the
    rest; neither tarfile's list of members nor kit's grows with the stream."""
    import tracemalloc
    device = tarfile.TarInfo("ckpt/null")
    device.type = tarfile.CHRTYPE
    folder = tarfile.TarInfo("ckpt")
    folder.type = tarfile.DIRTYPE
    n = 40000  # 20 MB of headers
    tar = tmp_path / "devices.tar"
    tar.write_bytes(folder.tobuf(tarfile.GNU_FORMAT) + device.tobuf(tarfile.GNU_FORMAT) * n + b"\0" * 1024)
    tracemalloc.start()
    try:
        done = untar.unpack(LocalRunner("h").read_out(f"cat {tar}", 10), Target(tmp_path, "ckpt"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    assert done.left_out_count == n and done.left_out[0] == ("ckpt/null", "a device, fifo or socket")


def test_what_is_not_a_tar_stream_is_an_error_naming_the_host(tmp_path):
    with pytest.raises(KitError, match=r"^h2: what came is not a whole tar stream"):
        untar.unpack(LocalRunner("h2").read_out("printf 'not a tar'", 10), Target(tmp_path, "x"), host="h2")


def test_a_silent_host_stops_the_copy_within_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(untar, "STALL_S", 1)
    with pytest.raises(untar.Stalled, match="h3: no byte came"):
        untar.unpack(LocalRunner("h3").read_out("sleep 30", 1), Target(tmp_path, "x"), host="h3")


# ---------------------------------------------------------------- the container's side, run in sh here

def sh(script: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script, "sh", *args], input=stdin, capture_output=True, timeout=60)


def test_the_pack_script_streams_a_path_and_refuses_a_link_out_of_the_workspace(tmp_path):
    ws = tmp_path / "ws"
    (ws / "ckpt").mkdir(parents=True)
    (ws / "ckpt" / "model.pt").write_bytes(b"\0\1\2")
    (ws / "escape").symlink_to("/etc")
    (ws / "latest").symlink_to(ws / "ckpt")
    out = sh(transfer.PACK, str(ws / "latest"), str(ws))
    assert out.returncode == 0
    names = tarfile.open(fileobj=io.BytesIO(out.stdout)).getnames()
    assert names == ["ckpt", "ckpt/model.pt"]
    bad = sh(transfer.PACK, str(ws / "escape" / "passwd"), str(ws))
    assert bad.returncode == 4 and b"leads out of the workspace (a link to /etc/passwd)" in bad.stderr
    assert bad.stdout == b""
    missing = sh(transfer.PACK, str(ws / "nope"), str(ws))
    assert missing.returncode == 3 and b"no such file or folder" in missing.stderr
    assert transfer.pack_command("kit-lab", WS, f"{WS}/a b").startswith("docker exec kit-lab sh -c ")
    assert transfer.pack_command("kit-lab", WS, f"{WS}/a b").endswith(f" sh '{WS}/a b' {WS}")


def test_a_folder_goes_to_a_host_as_a_stream_and_lands_whole(tmp_path):
    src, ws = tmp_path / "data", tmp_path / "ws"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "blob.bin").write_bytes(os.urandom(3 << 20))
    (src / "a.txt").write_text("a\r\n")
    (src / "link").symlink_to("a.txt")
    os.mkfifo(src / "fifo")  # not a file: not sent
    ws.mkdir()
    dest = Remote(HOSTS[0], str(ws), "gpu-1:", False)
    assert sh(transfer.PROBE, str(ws)).stdout == b"folder\n"
    assert sh(transfer.PROBE, str(ws / "new")).stdout == b"none\n"
    assert sh(transfer.PROBE, str(ws / "no" / "new")).stdout == b"noparent\n"
    into, name = cpargs.remote_target("folder", dest, Local(src, str(src), False))
    stream = b"".join(transfer.tar_chunks(src, name))
    r = sh(transfer.UNPACK, into, str(ws), stdin=stream)
    assert r.returncode == 0, r.stderr
    got = ws / "data"
    assert (got / "sub" / "blob.bin").read_bytes() == (src / "sub" / "blob.bin").read_bytes()
    assert (got / "a.txt").read_bytes() == b"a\r\n" and os.readlink(got / "link") == "a.txt"
    assert not (got / "fifo").exists()
    (ws / "out").symlink_to("/etc")
    refused = sh(transfer.UNPACK, str(ws / "out"), str(ws), stdin=stream)
    assert refused.returncode == 4 and b"leads out of the workspace" in refused.stderr


def test_where_a_copy_lands_on_a_host_follows_docker_cp(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    at = lambda p: Remote(HOSTS[0], f"{WS}/{p}".rstrip("/"), f"gpu-1:{p}", p.endswith("/."))  # noqa: E731
    folder, file = Local(tmp_path / "d", str(tmp_path / "d"), False), Local(tmp_path / "f", str(tmp_path / "f"), False)
    assert cpargs.remote_target("folder", at("runs"), folder) == (f"{WS}/runs", "d")
    assert cpargs.remote_target("folder", at("runs"), Local(tmp_path / "d", f"{tmp_path}/d/.", True)) == \
        (f"{WS}/runs", "")
    assert cpargs.remote_target("none", at("runs/new"), file) == (f"{WS}/runs", "new")
    assert cpargs.remote_target("file", at("runs/f"), file) == (f"{WS}/runs", "f")
    with pytest.raises(BadInput, match="a folder cannot be copied onto it"):
        cpargs.remote_target("file", at("runs/f"), folder)
    with pytest.raises(BadInput, match=f"the folder {WS}/no does not exist on gpu-1"):
        cpargs.remote_target("noparent", at("no/new"), file)


# ---------------------------------------------------------------- kit exec's byte path

def test_a_commands_output_and_input_pass_byte_for_byte_with_its_exit_code(tmp_path):
    data = b"\r\n\0\xff" + os.urandom(1 << 16) + b"no newline"
    (tmp_path / "in").write_bytes(data)
    with open(tmp_path / "in", "rb") as stdin, open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        code = LocalRunner("h").interact("cat; printf 'e\\r' >&2; exit 7", stdin=stdin, stdout=out, stderr=err)
    assert code == 7 and (tmp_path / "out").read_bytes() == data and (tmp_path / "err").read_bytes() == b"e\r"
    assert hashlib.sha256((tmp_path / "out").read_bytes()).digest() == hashlib.sha256(data).digest()
    with open(tmp_path / "out", "wb") as out:
        assert LocalRunner("h").interact("cat", stdin=None, stdout=out, stderr=out) == 0  # no input: none is read
    assert (tmp_path / "out").read_bytes() == b""
