"""kit bench allreduce and train: sizes, the bandwidths as nccl-tests defines them, the headline, the scaling table
and the plots (drawn for real, and read back)."""

import json

import pytest

from kit.bench import figures as bf
from kit.bench.figures import Allreduce, TrainRun
from kit.cli.bench import _host_counts
from kit.errors import BadInput


@pytest.mark.parametrize("text, size", [("1K", 1024), ("64M", 64 << 20), ("256MiB", 256 << 20), ("1g", 1 << 30),
                                        ("4096", 4096), (" 2 KB ", 2048), ("1000000", 1000000), ("4", 4)])
def test_sizes_are_read_in_powers_of_1024(text, size):
    assert bf.parse_size(text, "--max-size") == size


@pytest.mark.parametrize("text", ["", "0", "1T", "-1K", "1.5M", "big", "2", "6", "2G", "1000001"])
def test_a_size_that_is_not_one_is_refused_naming_the_flag(text):
    with pytest.raises(BadInput, match="--min-size"):
        bf.parse_size(text, "--min-size")


def test_size_text():
    assert [bf.size_text(s) for s in (1024, 64 << 20, 1 << 30, 1000, 1536)] == \
           ["1 KiB", "64 MiB", "1 GiB", "1000 B", "1536 B"]


def line(**fields):
    d = {"backend": "horovod", "transport": "gloo", "ranks": 3, "bytes": 64 << 20, "iters": 3, "seconds": 1.0}
    return bf.MARK + json.dumps({**d, **fields})


def test_bus_bandwidth_is_algorithm_bandwidth_times_2_n_minus_1_over_n():
    r = bf.parse_result(line())
    assert r.algbw_gbits == pytest.approx((64 << 20) * 8 / 1e9)
    assert r.busbw_gbits == pytest.approx(r.algbw_gbits * 4 / 3)
    eight = bf.parse_result(line(ranks=8, seconds=0.5))
    assert eight.busbw_gbits == pytest.approx((64 << 20) * 8 / 0.5 / 1e9 * 14 / 8)
    d = r.as_dict(link_gbits=0.5)
    assert d["busbw_per_link"] == pytest.approx(r.busbw_gbits / 0.5) and d["bytes"] == 64 << 20
    assert r.as_dict(None)["busbw_per_link"] is None


def test_only_the_jobs_figures_are_read_and_one_that_does_not_add_up_is_an_error():
    assert bf.parse_result("epoch 1: loss 2.3") is None
    assert bf.parse_result("[1,0]<stdout>: " + line()) is None  # a figure is the start of rank 0's line
    for bad in (bf.MARK + "{not json", bf.MARK + json.dumps({"bytes": 1}), line(seconds=0), line(ranks=1),
                line(iters=-1), line(seconds="nan"), line(seconds="Infinity"), line(bytes=1.9), line(ranks="3"),
                line(backend="evil"), line(transport="[/oops]"), line(iters=True)):
        with pytest.raises(ValueError, match="the allreduce job printed"):
            bf.parse_result(bad)


def results(backend="horovod", sizes=(1 << 20, 4 << 20, 64 << 20, 256 << 20), gbits=0.9):
    ranks = 3
    return [Allreduce(backend, "gloo", ranks, s, 3, s * 8 / (gbits * 1e9 * ranks / (2 * (ranks - 1)))) for s in sizes]


def test_the_headline_is_busbw_over_the_link_at_64_mib_for_each_backend():
    found = results("horovod", gbits=0.85) + results("torch", gbits=0.95)
    heads = bf.headline(found, link_gbits=1.0)
    assert heads == pytest.approx({"Horovod (gloo)": 0.85, "torch.distributed (gloo)": 0.95})
    assert bf.headline_size(found) == 64 << 20
    assert bf.headline(found, None) == {}


def test_without_64_mib_the_headline_is_read_at_the_largest_size_below_it_or_the_smallest():
    assert bf.headline_size(results(sizes=(1 << 10, 4 << 20))) == 4 << 20
    assert bf.headline_size(results(sizes=(128 << 20, 256 << 20))) == 128 << 20


def test_scaling_is_speedup_over_the_first_run_and_efficiency_per_rank():
    rows = bf.scaling([TrainRun(1, 1, 1000.0, "a"), TrainRun(2, 2, 1530.0, "b"), TrainRun(3, 3, 1710.0, "c")])
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 1.53, 1.71])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.765, 0.57])
    two = bf.scaling([TrainRun(1, 2, 800.0, "a"), TrainRun(3, 6, 1800.0, "b")])  # two slots a host
    assert two[1]["efficiency"] == pytest.approx(0.75)


def test_the_plots_are_pngs_of_the_figures(tmp_path):
    from PIL import Image

    a = bf.plot_allreduce(results() + results("torch", gbits=0.95), 0.96, "allreduce", tmp_path / "a.png")
    t = bf.plot_train(bf.scaling([TrainRun(1, 1, 1000.0, "a"), TrainRun(2, 2, 1530.0, "b")]), "train",
                      tmp_path / "t.png")
    for png in (a, t):
        with Image.open(png) as image:
            assert image.format == "PNG" and image.size[0] > 500 and len(image.getcolors(1 << 16) or []) > 5


def test_host_counts_are_from_one_to_the_clusters_hosts():
    assert _host_counts(None, 3) == [1, 2, 3]
    assert _host_counts("3,1, 2,2", 3) == [1, 2, 3]
    for bad in ("0,1", "1,4", "a", "", ","):
        with pytest.raises(BadInput, match="host counts from 1 to 3"):
            _host_counts(bad, 3)
