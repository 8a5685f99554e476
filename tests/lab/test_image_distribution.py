"""How the image reaches the lab's hosts: down a chain of the hosts themselves, each byte leaving this machine once;
a host the others cannot reach is routed around and named; a host whose link is cut mid-way keeps nothing of it."""

import os
import re
import subprocess
import sys
import time

import pytest

from harness import image_summary, lab_cluster

pytestmark = pytest.mark.lab


def image_id(h, tag: str) -> str:
    return h.docker("image", "inspect", "--format", "{{.Id}}", tag, check=False).stdout.strip()


def test_a_host_the_others_cannot_reach_is_routed_around_and_the_rest_pass_the_layers_on(project, lab):
    h1, h2, h3 = lab.hosts
    lab.forget_images()
    lab.wall_off(h2)  # h1's relay cannot reach h2's: h1 passes the layers on to h3, and h2 gets them from here
    try:
        with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt") as up:
            figures = image_summary(up.stdout)
            assert figures, up.stdout
            stream, from_here, between = figures["stream_mb"], figures["from_here_mb"], figures["between_mb"]
            assert (f"{h2.address}: not reached from {h1.address} (timed out); routed around it and sent its layers "
                    "from here") in up.stdout
            assert abs(from_here - 2 * stream) <= 2 and abs(between - stream) <= 2, up.stdout
            ids = {h.name: image_id(h, up_tag(up.stdout)) for h in lab.hosts}
            assert len(set(ids.values())) == 1 and "" not in ids.values(), ids
    finally:
        lab.open_up(h2)


def up_tag(out: str) -> str:
    return re.search(r"loaded image (kit-horovod:cpu-\w+)", out)[1]


def test_a_host_whose_link_is_cut_mid_way_keeps_nothing_and_the_next_up_completes(project, lab):
    h1, h2, h3 = lab.hosts
    lab.forget_images()
    up = subprocess.Popen([sys.executable, "-m", "kit", "up", "--hosts", "hosts.txt"], cwd=project, text=True,
                          env={**os.environ, "COLUMNS": "200", **lab.env}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    loading = h2.data / "docker" / "tmp"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and up.poll() is None:
            if any(p.name.startswith("docker-import-") and any(p.iterdir()) for p in loading.glob("*")):
                break
            time.sleep(0.1)
        assert up.poll() is None, "kit up ended before h2 received a byte"
        lab.cut(h2)  # mid-transfer: h1 can no longer pass it on, h3 hears nothing more from it
        out, err = up.communicate(timeout=600)
    finally:
        if up.poll() is None:
            up.kill()
        lab.mend(h2)
    assert up.returncode == 1, out + err
    failed = re.search(rf"^  {re.escape(h2.address)}: loading image (kit-horovod:cpu-\w+) failed: ", err, re.M)
    assert failed, err
    assert f"{h3.address}:" not in err  # cut off behind h2, then served again
    tag = failed[1]
    deadline = time.monotonic() + 60  # h2's relay gives up by itself once its peer is silent (30 s)
    while time.monotonic() < deadline and h2.processes(r"python3 -c"):
        time.sleep(1)
    assert not h2.processes(r"python3 -c"), "h2's relay is still running"
    assert image_id(h2, tag) == "" and not list(loading.glob("docker-import-*")), "h2 kept part of the image"
    with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt") as again:
        assert f"{h2.address}: loaded image {tag}" in again.stdout
        assert len({image_id(h, tag) for h in lab.hosts}) == 1
