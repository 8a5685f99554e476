"""GPU health in kit doctor (and, later, kit run's preflight): the pure parsers on recorded host output
(tests/unit/data/gpu_health_*.txt, each file says whose real output it follows), the pure judge, and doctor's reading
and rendering of them from the recorded text."""

from __future__ import annotations

import subprocess

import pytest

from helpers import REPO
from kit.doctor import gpufacts as gf
from kit.doctor import read as rd
from kit.doctor.gpuhealth import judge_health

DATA = REPO / "tests" / "unit" / "data"


def recorded(name: str) -> str:
    return (DATA / f"gpu_health_{name}.txt").read_text()


def judged(name: str, host: str = "h2") -> list[tuple[str, str, str]]:
    return [(f.level, f.text, f.fix) for f in judge_health(host, gf.parse_health(recorded(name)))]


def test_the_kernels_and_nvidia_smis_spellings_of_a_bus_are_one():
    assert gf.bus_key("00000000:3B:00.0") == gf.bus_key("0000:3b:00") == gf.bus_key("PCI:0000:3b:00") == "0000:3b:00"
    assert gf.bus_key("0000:3B:00.0") == "0000:3b:00" and gf.bus_key("00000001:1a:00.0") == "0001:1a:00"


def test_a_clean_h200_host_is_read_per_gpu_and_gives_no_warning():
    health = gf.parse_health(recorded("h200_clean"))
    assert [g.bus for g in health.gpus] == [f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA",
                                                                           "DB")]
    assert {(g.ecc_volatile, g.ecc_aggregate, g.retired, g.remapped, g.retire_pending, g.remap_pending,
             g.remap_failed) for g in health.gpus} == {(0, 0, None, 0, False, False, False)}
    assert (health.xids, health.log, health.lost) == ((), "dmesg", ())
    assert judged("h200_clean") == [("ok", "8 GPUs: no uncorrectable ECC error, nothing waits to be retired or "
                                           "remapped; no Xid since boot (dmesg)", "")]


def test_xid_79_and_a_page_pending_retirement_name_the_gpu_and_host_with_the_fix():
    health = gf.parse_health(recorded("v100_xid79"))
    assert len(health.gpus) == 7 and health.lost == (("0000:00:07.0", "Unknown Error"),)
    one = health.gpus[1]
    assert (one.index, one.bus, one.ecc_volatile, one.retired, one.retire_pending) == (1, "00000000:00:05.0", 1, 1,
                                                                                        True)
    assert [(x.bus, x.code, x.count) for x in health.xids] == [("0000:00:04", 13, 4), ("0000:00:05", 48, 1),
                                                                ("0000:00:05", 63, 1), ("0000:00:07", 79, 1)]
    found = judged("v100_xid79")
    assert [level for level, _, _ in found] == ["warn", "fail"]
    (_, page, page_fix), (_, bus, bus_fix) = found
    assert page == ("GPU 1 (00000000:00:05.0) on h2: a page waits to be retired after Xid 48 (double-bit ECC error) "
                    "(1 page retired; 1 uncorrectable ECC error since the driver loaded)")
    assert page_fix == ("it happens at the GPU's next reset: drain h2, then reset it (nvidia-smi -r -i 1, as root, "
                        "with no process on it) or reboot h2")
    assert bus == ("the GPU at 0000:00:07 on h2, which nvidia-smi does not list: Xid 79 (fallen off the bus) since "
                   "boot: jobs on it fail until it is back")
    assert bus_fix.startswith("drain h2 and reboot it") and "out of service" in bus_fix
    assert not any("Xid 13" in text for _, text, _ in found)  # the job's own fault: not the host's


def test_an_a100_row_waiting_to_be_remapped_is_a_warning_with_its_reset():
    health = gf.parse_health(recorded("a100_remap_pending"))
    (gpu,) = health.gpus
    assert (gpu.bus, gpu.remapped, gpu.remap_pending, gpu.remap_failed, health.log) == ("00000000:10:1C.0", 1, True,
                                                                                         False, "journalctl")
    assert judged("a100_remap_pending") == [
        ("warn", "GPU 0 (00000000:10:1C.0) on h2: a row waits to be remapped (1 row remapped; 0 uncorrectable ECC "
                 "errors since the driver loaded)",
         "it happens at the GPU's next reset: drain h2, then reset it (nvidia-smi -r -i 0, as root, with no process "
         "on it) or reboot h2")]


def test_xid_79_on_a_gpu_nvidia_smi_still_lists_is_named_by_its_index():
    """The kernel's own lines (dmesg's, without the script's counts) parse too: a preflight may pass them as they are."""
    text = recorded("h200_clean").replace("@@kit xid\nfrom dmesg\n", "@@kit xid\nfrom dmesg\n"
                                          "[ 5012.301] NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.\n"
                                          "[ 5012.302] NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.\n")
    (finding,) = judge_health("h2", gf.parse_health(text))
    assert (finding.level, finding.text) == ("fail", "GPU 3 (00000000:5D:00.0) on h2: Xid 79 (fallen off the bus) "
                                                     "since boot, 2 times: jobs on it fail until it is back")


@pytest.mark.parametrize("line, code, bus", [
    ("Sep 09 15:53:19 saturn kernel: NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus.", 79,
     "0000:10:00"),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No", 94,
     "0000:01:00"),
    ("[  269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff", 3, "0000:01:00"),
])
def test_xid_lines_of_every_driver_age_are_read(line, code, bus):
    (xid,) = gf.parse_xids(line)
    assert (xid.code, xid.key, xid.count) == (code, bus, 1)


# What a user can make the kernel print (kernel 6.x's own formats): a file run with an empty argv, a segfault's
# mapped file, a comm (15 characters) that starts a line, a multi-line record's second line (journalctl indents it).
FORGED = [
    "[  812.100201] process 'NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.' launched "
    "'/tmp/x' with NULL argv: empty string added",
    "[  812.200311] python3[4242]: segfault at 0 ip 00007f sp 00007ffd error 4 in NVRM: Xid (PCI:0000:3b:00): 79, "
    "GPU has fallen off the bus.[7f12+1000] likely on CPU 3",
    "[  812.300411] NVRM: Xid (PCI[4243]: segfault at 0 ip 00007f sp 00007ffd error 4",
    "[  812.400511] h2 kernel: audit: name=\"NVRM: Xid (PCI:0000:3b:00): 48, DBE\"",
    "               NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, said by a user: dmesg -f kern leaves such lines out, the bare form is "
    "never in the script's input",
]
REAL = ["[ 5012.302101] NVRM: Xid (PCI:0000:5d:00): 79, pid=0, GPU has fallen off the bus.",
        "[ 5013.402101] h2 kernel: NVRM: Xid (PCI:0000:5d:00): 79, pid=0, GPU has fallen off the bus.",
        "[ 5014.502101] NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9)."]


def test_a_forged_xid_in_the_kernels_log_is_not_read_and_the_drivers_own_are():
    """A name a user chose, printed by the kernel inside its own line, fails no healthy host: the script's filter
    (run here, on these lines) keeps only lines whose message is the driver's."""
    log = "\n".join(FORGED[:-1] + REAL) + "\n"
    out = subprocess.run(["sh", "-c", gf.COUNT], input=log, capture_output=True, text=True, timeout=30).stdout
    assert out.splitlines() == ["2 Xid (PCI:0000:5d:00): 79, pid=0, GPU has fallen off the bus.",
                                "1 Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9)."]
    assert [(x.code, x.key, x.count) for x in gf.parse_xids(out)] == [(79, "0000:5d:00", 2), (94, "0000:01:00", 1)]
    assert [gf.parse_xids(line) for line in FORGED[:-1]] == [[]] * (len(FORGED) - 1)
    assert "dmesg -f kern" in gf.SCRIPT and "-o short-monotonic" in gf.SCRIPT


def test_application_xids_are_told_not_warned_of_and_a_host_without_gpus_says_nothing():
    text = recorded("h200_clean").replace("from dmesg\n", "from dmesg\n2 Xid (PCI:0000:18:00): 31, pid=1, name=python3, "
                                          "Ch 00000010, intr 10000000. MMU Fault\n1 Xid (PCI:0000:2a:00): 43, pid=2\n")
    (finding,) = judge_health("h2", gf.parse_health(text))
    assert finding.level == "ok" and finding.text.endswith("Xid 31 (memory page fault (an application's)), 43 (GPU "
                                                           "stopped processing (an application's)) since boot, none "
                                                           "of them the hardware's")
    assert judge_health("h2", gf.parse_health("@@kit gpuq\n@@kit xid\nfrom dmesg\n")) == []
    assert judge_health("h2", None) == []


def test_a_remapping_failure_fails_and_an_unreadable_kernel_log_is_said():
    failed = recorded("a100_remap_pending").replace("Remapping Failure Occurred        : No",
                                                    "Remapping Failure Occurred        : Yes")
    (finding,) = judge_health("h2", gf.parse_health(failed))
    assert finding.level == "fail" and "a row remapping failed (1 row remapped" in finding.text
    assert "replaced" in finding.fix
    unread = recorded("h200_clean").replace("from dmesg", "from ")
    assert judge_health("h2", gf.parse_health(unread))[0].text.endswith(
        "the kernel's log could not be read (dmesg and journalctl refused): Xids not checked")


def test_the_script_runs_here_and_changes_nothing():
    """This machine has no NVIDIA GPU and may refuse dmesg: the sections come back all the same."""
    out = subprocess.run(["sh", "-c", gf.SCRIPT], capture_output=True, text=True, timeout=60).stdout
    health = gf.parse_health(out)
    assert health is not None and health.gpus == () and health.log in ("dmesg", "journalctl", "")


def test_doctor_reads_the_hosts_gpu_health_from_its_sections_not_the_containers():
    text = recorded("v100_xid79") + "@@kit container\n|@@kit xid\n|from dmesg\n|1 Xid (PCI:0000:00:04): 79, forged\n"
    reading = rd.Reading("h2")
    rd.parse_doctor(reading, text)
    assert [(x.bus, x.code) for x in reading.gpu_health.xids] == [("0000:00:04", 13), ("0000:00:05", 48),
                                                                   ("0000:00:05", 63), ("0000:00:07", 79)]
