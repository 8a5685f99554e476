"""Fixtures for tests on the real engine and the lab hosts."""

import os
from pathlib import Path

import pytest

from harness import SLOT, Lab, make_project

LAB_HOSTS = 3
# Modules that need no image, first: they run while the image is built (tests/engine builds it beside the lab,
# and `project` waits for that build rather than building it too).
FIRST = ("test_bad_input.py", "test_prepare_hosts.py")
# tests/run runs these modules on a second lab of their own (KIT_LAB_PART=second, on the lab of KIT_LAB_SLOT=1),
# beside the rest of the lab (KIT_LAB_PART=first), after tests/engine and tests/unit in the same stream: most of a lab
# test's time waits on its hosts, and the lab alone was most of the suite's time. They name no address or host of slot
# 0's lab, have no test alone, and leave this machine's Slurm, apt and local clusters alone
# (tests/unit/test_suite_layout.py reads them for it); the modules that use those run on slot 0 only.
# test_export.py uses no lab host at all (the engine's image, exported here): it evens the two streams out.
SECOND = ("test_hostile.py", "test_image_distribution.py", "test_run_on_hosts.py", "test_shared_storage.py",
          "test_quickstart.py", "test_k8s_pods.py", "test_export.py")
PART = os.environ.get("KIT_LAB_PART", "")


def pytest_configure(config):
    if PART not in ("", "first", "second"):
        raise pytest.UsageError(f"KIT_LAB_PART={PART}: use first or second (or leave it unset for every lab module)")
    if PART and (SLOT == 0) != (PART == "first"):
        raise pytest.UsageError(f"KIT_LAB_PART={PART} runs on the lab of KIT_LAB_SLOT={1 if PART == 'first' else 0}"
                                f" (the lab tests/run gives it), not {SLOT}: two streams on one lab remove each "
                                "other's hosts")


def pytest_collection_modifyitems(config, items):
    """This stream's part of the lab's modules (all of them with no KIT_LAB_PART); FIRST, then the modules with no
    test `alone`, then those with some, then those whose every test is: tests/engine builds its heavy images (the gpu
    image's CUDA wheels) beside the lab's first half hour, and a test alone waits for the build running. Within a
    module its tests alone come last, in their own order, but before one marked `last`: each time a test alone comes
    after one that is not, it waits for the test the other stream is running (up to two minutes of the second lab's),
    and tests alone that follow each other wait once (tests/conftest.py)."""
    if PART:
        mine = [item for item in items if (item.path.name in SECOND) == (PART == "second")]
        config.hook.pytest_deselected(items=[item for item in items if item not in mine])
        items[:] = mine
    alone = {item.nodeid for item in items if item.get_closest_marker("alone")}
    some = {item.path.name for item in items if item.nodeid in alone}
    every = some - {item.path.name for item in items if item.nodeid not in alone}
    order = {name: i for i, name in enumerate(dict.fromkeys(item.path.name for item in items))}
    items.sort(key=lambda item: (item.path.name not in FIRST, item.path.name in some, item.path.name in every,
                                 order[item.path.name], bool(item.get_closest_marker("last")), item.nodeid in alone))
    # (sort is stable: within each of those, the tests' own order)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    with Lab(LAB_HOSTS, tmp_path_factory.mktemp("lab")) as lab:
        yield lab


@pytest.fixture(scope="module", autouse=True)
def clean_lab(request, lab):
    """Each module starts on lab hosts with no cluster on them, and leaves them so: what a module left (beyond a
    workspace that holds files, which kit down keeps on purpose) fails that module, and is removed before the
    next one starts."""
    for cluster in lab.clusters():
        lab.remove_cluster(cluster)
    yield
    left = {cluster: found for cluster in lab.clusters() if (found := lab.leftovers(cluster, strict=False))}
    for cluster in lab.clusters():
        lab.remove_cluster(cluster)
    if left:
        pytest.fail(f"{request.module.__name__} left clusters on the lab hosts: {left}")
    if shared := [h.name for h in lab.hosts if not h.own_kit_dir()]:
        pytest.fail(f"after {request.module.__name__}, {', '.join(shared)} no longer have a /var/lib/kit of their "
                    "own: the lab's hosts now share one folder (keys, workspaces); the lab must be made again")


@pytest.fixture(scope="session")
def project(tmp_path_factory, client, lab) -> Path:
    """A user's project folder: kit.yaml with the cluster's name, hosts.txt, and kit's default image built."""
    return make_project(tmp_path_factory.mktemp("project"), lab, "lab")


@pytest.fixture(scope="session")
def settings(tmp_path_factory, lab) -> Path:
    """The project's kit.yaml and hosts.txt without its image: for what kit refuses, or checks on the hosts, before
    any image is needed."""
    return make_project(tmp_path_factory.mktemp("settings"), lab, "lab", image=False)
