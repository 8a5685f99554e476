"""Before a long job (kit.doctor.deep): the ring of links, the halves where a ring link is slow, the host that holds
the links back, the host whose compute is slow; what each host is told."""

from __future__ import annotations

import pytest

from kit.bench.net import Link
from kit.doctor import deep
from kit.errors import KitError

NAMES = ["h1", "h2", "h3", "h4"]


def speeds(slow_host: str | None, fast: float = 9.0, slow: float = 0.9):
    """A link's speed where one host's NIC runs at a tenth of the others'."""
    return lambda a, b: slow if slow_host in (a, b) else fast


def links(pairs, speed) -> list[Link]:
    return [Link(a, b, speed(a, b)) for a, b in pairs]


def test_the_ring_is_one_link_a_host_each_way():
    assert deep.ring(NAMES) == [("h1", "h2"), ("h2", "h3"), ("h3", "h4"), ("h4", "h1")]
    assert deep.ring(["a", "b"]) == [("a", "b"), ("b", "a")] and deep.ring(["a"]) == []


def test_a_host_whose_nic_runs_at_a_tenth_is_found_by_the_ring_then_the_halves():
    speed = speeds("h3")
    ring = links(deep.ring(NAMES), speed)
    slow = deep.slow_links(ring)
    assert [(l.source, l.target) for l in slow] == [("h2", "h3"), ("h3", "h4")]
    pairs = deep.halves(NAMES, slow)  # the suspects h2, h3, h4, each with the one good host h1, both ways
    assert pairs == [("h2", "h1"), ("h1", "h2"), ("h3", "h1"), ("h1", "h3"), ("h4", "h1"), ("h1", "h4")]
    assert deep.bad_hosts(NAMES, ring, links(pairs, speed)) == {
        "h3": "its links run at 0.90 Gbit/s (h3 -> h1), the others' at 9.00"}


def test_three_hosts_as_the_lab_has_and_two_with_no_good_host_to_pair_with():
    names = ["h1", "h2", "h3"]
    speed = speeds("h3")
    ring = links(deep.ring(names), speed)  # h1->h2 fast, h2->h3 and h3->h1 slow: h1 and h2 both suspects
    pairs = deep.halves(names, deep.slow_links(ring))
    assert deep.bad_hosts(names, ring, links(pairs, speed)).keys() == {"h3"}
    two = links(deep.ring(["a", "b"]), lambda a, b: 9.0 if a == "a" else 0.9)  # no median to stand out from: none
    assert deep.bad_hosts(["a", "b"], two, []) == {}


def test_a_cluster_whose_links_are_alike_names_none_and_measures_the_ring_alone():
    measured = []

    def measure(sender, receiver, seconds, at):
        measured.append((sender.name, receiver.name, seconds, at))
        return Link(sender.name, receiver.name, 9.0 + 0.3 * len(measured) % 1)

    class Node:
        def __init__(self, name):
            self.name = name
    ring, pairs = deep.measure_links([Node(n) for n in NAMES], {"h2": "192.168.9.2"}, measure)
    assert pairs == [] and len(ring) == 4 and deep.bad_hosts(NAMES, ring, pairs) == {}
    assert sorted(measured)[0] == ("h1", "h2", deep.LINK_S, "192.168.9.2")  # on the training network's address


def test_a_host_with_slow_compute_is_named_with_its_figure_and_the_others_are_ok():
    found = [deep.Compute("h1", 40.0, "cpu"), deep.Compute("h2", 42.0, "cpu"), deep.Compute("h3", 20.0, "cpu")]
    assert deep.slow_compute(found) == {"h3": "its 512x512 matrix product (cpu) runs at 20.0 GFLOP/s, the others' "
                                              "at 41.0"}
    assert deep.slow_compute(found[:2]) == {}
    ring = links(deep.ring(["h1", "h2", "h3"]), speeds(None))
    said = {(f.host, f.check, f.level) for f in deep.findings(found, ring, [], ["h1", "h2", "h3"])}
    assert said == {("h1", "preflight", "ok"), ("h2", "preflight", "ok"), ("h3", "compute", "warn")}


def test_a_compute_figure_that_is_no_number_is_its_hosts_zero_and_the_good_hosts_stay():
    """A host's image that says `Infinity` (or nan, or a negative) made every other host slow against it, and
    `--exclude-bad` dropped the good ones: the figure is that host's 0.0, said as such, and only it is named."""
    said = [deep.compute_of("h1", '{"gflops": 40.5, "device": "cpu"}'),
            deep.compute_of("h2", 'torch says hello\n{"gflops": 41.5, "device": "cpu"}\n'),
            deep.compute_of("h3", '{"gflops": Infinity, "device": "cpu"}')]
    assert said[2] == deep.Compute("h3", 0.0, "cpu; its check said inf, not a figure")
    for bad in ("NaN", "-1", "1e12", "0"):
        assert deep.compute_of("h3", '{"gflops": %s, "device": "cpu"}' % bad).gflops == 0.0
    assert set(deep.slow_compute(said)) == {"h3"}
    ring = links(deep.ring(["h1", "h2", "h3"]), speeds(None))
    assert {(f.host, f.check) for f in deep.findings(said, ring, [], ["h1", "h2", "h3"]) if f.level != "ok"} == \
        {("h3", "compute")}
    with pytest.raises(KitError, match="printed no figure") as e:
        deep.compute_of("h3", "Traceback (most recent call last):\n...")
    assert e.value.host == "h3"


def test_the_preflight_names_a_gpu_off_the_bus_and_a_page_waiting_to_retire_with_the_host_and_fix():
    """The recorded V100 host (an Xid 79, a page waiting to be retired): the preflight says what doctor says of it,
    the host named with each GPU and its fix; a clean host (the recorded H200) gets its ok line alone."""
    from helpers import REPO
    from kit.doctor import gpufacts
    data = REPO / "tests" / "unit" / "data"
    gpus = {"h1": gpufacts.parse_health((data / "gpu_health_h200_clean.txt").read_text()),
            "h2": gpufacts.parse_health((data / "gpu_health_v100_xid79.txt").read_text())}
    compute = [deep.Compute("h1", 900.0, "cuda"), deep.Compute("h2", 880.0, "cuda")]
    ring = links(deep.ring(["h1", "h2"]), speeds(None))
    found = deep.findings(compute, ring, [], ["h1", "h2"], gpus)
    assert [(f.host, f.level) for f in found] == [("h2", "warn"), ("h2", "fail"), ("h1", "ok")]
    assert found[0].text.startswith("GPU 1 (00000000:00:05.0) on h2: a page waits to be retired")
    assert "Xid 79 (fallen off the bus)" in found[1].text and found[1].fix.startswith("drain h2 and reboot it")


def test_against_the_baseline_a_host_below_its_own_figures_is_named_even_alone_or_when_all_are_alike(tmp_path):
    """kit bench baseline keeps each host's matrix product and fastest ring link; later every host runs at half its
    link speed (a switch port renegotiated: all alike, so no host is slower than the others) and h2's matrix product
    at 0.4 of its own: both named against the baseline, with the figure and its share; a product on another device
    than the baseline's is not compared, and one host alone is compared too."""
    names = ["h1", "h2", "h3"]
    ring = links(deep.ring(names), speeds(None, fast=10.0))
    then = deep.figures_of([deep.Compute(h, 20.0, "cpu") for h in names], ring, names)
    assert then["h1"] == deep.Figures(20.0, "cpu", 10.0)
    saved = deep.save_baseline(tmp_path, then, when=1_780_000_000)
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
    baseline = deep.load_baseline(tmp_path)
    assert baseline == (1_780_000_000, then)
    compute = [deep.Compute("h1", 19.0, "cpu"), deep.Compute("h2", 8.0, "cpu"), deep.Compute("h3", 12.0, "cuda")]
    slower = links(deep.ring(names), speeds(None, fast=5.0))
    found = {(f.host, f.check): f for f in deep.findings(compute, slower, [], names, baseline=baseline)}
    assert deep.slow_links(slower) == [] and ("h1", "preflight") not in found
    assert found["h2", "compute"].level == "warn" and found["h2", "compute"].text.startswith(  # (and the others')
        "its 512x512 matrix product (cpu) runs at 8.0 GFLOP/s, the others' at 15.5; 0.40 of its baseline (20.0 on ")
    alike = [deep.Compute(h, 9.0, "cpu") for h in names]  # (all alike: named against the baseline alone)
    assert [f.text[:58] for f in deep.findings(alike, ring, [], names, baseline=baseline)] == [
        "its 512x512 matrix product (cpu) runs at 9.0 GFLOP/s, 0.45"] * 3
    assert found["h1", "links"].text.startswith("its fastest link runs at 5.00 Gbit/s, 0.50 of its baseline (10.00 on ")
    assert ("h3", "compute") not in found and ("h3", "links") in found  # (another device: not compared)
    alone = deep.findings([deep.Compute("h1", 9.0, "cpu")], [], [], ["h1"], baseline=baseline)
    assert [(f.host, f.check, f.level) for f in alone] == [("h1", "compute", "warn")]
    healthy = deep.findings([deep.Compute(h, 18.0, "cpu") for h in names], ring, [], names, baseline=baseline)
    assert {f.level for f in healthy} == {"ok"}


def test_a_baseline_that_is_not_one_is_none(tmp_path):
    assert deep.load_baseline(tmp_path) is None
    (tmp_path / deep.BASELINE).write_text('{"taken": 1, "hosts": {"h1": {"gflops": "fast", "gbits": -3}}}')
    assert deep.load_baseline(tmp_path) == (1.0, {"h1": deep.Figures(None, "", None)})
    (tmp_path / deep.BASELINE).write_text("[1, 2]")
    assert deep.load_baseline(tmp_path) is None
