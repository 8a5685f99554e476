"""Secrets: what kit lets into an image, onto a printed line and into a job's record (SECURITY.md, "Secrets").

An index URL may carry its credential in the path (https://host/<token>/org/repo/python/simple/) or in the query
(?access_token=..., a pre-signed X-Amz-Signature); a job's variable may be a secret whatever its name.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kit import redact
from kit.app import app
from kit.image.build import Sources, package_sources
from kit.image.base import Base
from kit.jobs.commands.horovod import Slot
from kit.config.settings import ConfigFile, build_config
from kit.errors import KitError
from kit.jobs.env import shown
from kit.backends.cluster.run import Job
from kit.image.pipconfig import PipSettings
from kit.cluster.place import Place
from kit.image.recipe import make_recipe
from kit.cluster.state import ClusterState, HostState
from kit.image.wheels import Target, Wheelhouse, resolve

TOKENS = ("AbCd1234EfGh5678", "s3cr3tq", "Sig0123abcdef", "ghp_0123456789abcdefABCDEF0123456789abcd")
PATH_TOKEN = "https://dl.cloudsmith.io/AbCd1234EfGh5678/lab/wheels/python/simple/"
QUERY_TOKEN = "https://pypi.lab/simple?access_token=s3cr3tq"
PRESIGNED = "https://bucket.s3.amazonaws.com/pkgs/extra-1.0-py3-none-any.whl?X-Amz-Signature=Sig0123abcdef"
GIT_TOKEN = "git+https://gitlab.lab/ghp_0123456789abcdefABCDEF0123456789abcd/horovod@v0.28.1"


def no_token(text: str) -> bool:
    return not any(t in text for t in TOKENS)


def recipe_text(recipe) -> str:
    return "\n".join(f.name + "\n" + (f.text or "") for f in recipe.files)


def sources_lines(config, machine: PipSettings) -> list[str]:
    """The `sources` lines kit build prints, with every source answering."""
    settings, notes = package_sources(config, machine, {}, probe_all=lambda urls, s, e: {u: None for u in urls})
    wheelhouse = Wheelhouse(Path("/nowhere"), {})
    found = Sources(Base("debian:bookworm-slim", "pulled"), None, settings, Target("3.11", "x86_64", (2, 36)),
                    wheelhouse, None, notes)
    return [f"{k} {v}" for k, v in found.lines()]


def test_a_token_in_an_index_urls_path_or_query_never_reaches_the_image(tmp_path, monkeypatch):
    # From kit.yaml (and its flags): the indexes, Horovod's source and a package from a URL.
    config = build_config(ConfigFile(), dict(flavor="cpu", pip_index_urls=(PATH_TOKEN, QUERY_TOKEN),
                                             horovod_source=GIT_TOKEN, pip_packages=(f"extra @ {PRESIGNED}",)))
    recipe = make_recipe(config)
    assert no_token(recipe_text(recipe)), [f.name for f in recipe.files if not no_token(f.text or "")]
    assert "PIP_INDEX_URL" not in recipe.dockerfile  # used on this machine only
    assert no_token("\n".join(sources_lines(config, PipSettings())))
    # The resolution's status lines, and its error when pip fails (pip itself prints the indexes it looks in).
    status: list[str] = []
    failed = subprocess.CompletedProcess([], 1, "", f"Looking in indexes: {PATH_TOKEN}, {QUERY_TOKEN}\nERROR: no")
    with pytest.raises(KitError) as e:
        resolve(config, Target("3.11", "x86_64", (2, 36)), PipSettings(), tmp_path / "w", env={},
                run=lambda argv, **k: failed if any(PRESIGNED in a for a in argv) else subprocess.CompletedProcess(argv, 0),
                on_status=status.append)  # every group resolves (to nothing) but the one of the package from a URL
    shown = "\n".join([*status, str(e.value), e.value.command or "", e.value.output_tail or ""])
    assert "bucket.s3.amazonaws.com/****" in str(e.value) and "pypi.lab/****" in shown and no_token(shown), shown
    # A harmless index still reaches the image's pip, for the image's users.
    plain = make_recipe(build_config(ConfigFile(), dict(flavor="cpu", pip_index_urls=("https://pypi.lab/simple",))))
    assert "ENV PIP_INDEX_URL=https://pypi.lab/simple" in plain.dockerfile
    # From this machine's pip configuration: printed in the sources, and in the plan of `kit build --dry-run`.
    machine = PipSettings({"index-url": PATH_TOKEN, "extra-index-url": QUERY_TOKEN, "find-links": PRESIGNED})
    plain_config = build_config(ConfigFile(), dict(flavor="cpu"))
    assert no_token("\n".join(sources_lines(plain_config, machine)))
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {PATH_TOKEN}\nextra-index-url = {QUERY_TOKEN}\nfind-links = {PRESIGNED}\n")
    (tmp_path / "kit.yaml").write_text(f"build:\n  flavor: cpu\n  pip_index_urls: ['{PATH_TOKEN}', '{QUERY_TOKEN}']\n"
                                       f"  horovod_source: '{GIT_TOKEN}'\n")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["build", "--dry-run"], env={"PIP_CONFIG_FILE": str(conf), "COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "dl.cloudsmith.io/****" in r.output and "pypi.lab/****" in r.output
    assert no_token(r.output), r.output


@pytest.mark.parametrize("url, printed", [
    (PATH_TOKEN, "https://dl.cloudsmith.io/****"),
    (QUERY_TOKEN, "https://pypi.lab/****"),
    (PRESIGNED, "https://bucket.s3.amazonaws.com/****"),
    (GIT_TOKEN, "git+https://gitlab.lab/****"),
    ("https://u:s3cr3tq@pypi.lab:8443/AbCd1234EfGh5678/simple", "https://****@pypi.lab:8443/****"),
    ("https://pypi.lab/simple#s3cr3tq", "https://pypi.lab/****"),
    ("https://pypi.lab/simple", "https://pypi.lab/simple"),
    ("http://devpi.lab:3141/root/pypi/+simple/", "http://devpi.lab:3141/root/pypi/+simple/"),
    ("https://pkgs.dev.azure.com/org/_packaging/feed/pypi/simple/",
     "https://pkgs.dev.azure.com/org/_packaging/feed/pypi/simple/"),
    ("https://gitlab.lab/api/v4/groups/ml/-/packages/pypi/simple",
     "https://gitlab.lab/api/v4/groups/ml/-/packages/pypi/simple"),
    ("https://download.pytorch.org/whl/cu128", "https://download.pytorch.org/whl/cu128"),
    ("git+https://github.com/horovod/horovod@3a31d93f0c6b2d4e5a6b7c8d9e0f1a2b3c4d5e6f",
     "git+https://github.com/horovod/horovod@3a31d93f0c6b2d4e5a6b7c8d9e0f1a2b3c4d5e6f"),
])
def test_printed_urls_hide_path_and_query_tokens(url, printed):
    assert redact.redact(url) == printed
    assert redact.harmless(url) == (url == printed)
    line = redact.text(f"the package source {url} does not answer: timed out")
    assert line == f"the package source {printed} does not answer: timed out"
    described = " ".join(PipSettings({"index-url": url, "extra-index-url": url, "find-links": url,
                                      "constraint": url, "proxy": url}).describe())
    assert no_token(described), described
    config = build_config(ConfigFile(), dict(flavor="cpu", torch_index_url="https://t.lab/Sig0123abcdef/cpu"))
    with pytest.raises(KitError) as e:  # a source that does not answer is named, redacted
        package_sources(config, PipSettings({"index-url": url}), {},
                        probe_all=lambda urls, s, env: {u: "timed out" for u in urls})
    assert no_token(str(e.value) + (e.value.hint or "")), str(e.value)


def test_only_allow_listed_names_show_their_values():
    env = (("AZURE_STORAGE_CONNECTION_STRING", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=s3cr3tq"),
           ("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T000/B000/s3cr3tq"),
           ("AWS_URL", PRESIGNED), ("DATABASE_URL", "postgres://u:p/ss@h/db"), ("MY_SETTING", "s3cr3tq"),
           ("OMP_NUM_THREADS", "4"), ("NCCL_DEBUG", "INFO"), ("CUDA_VISIBLE_DEVICES", "0,1"),
           ("NCCL_SOCKET_IFNAME", "https://u:s3cr3tq@h/x"))  # allow-listed, but a URL is no value it takes
    assert shown(env) == ("AZURE_STORAGE_CONNECTION_STRING=(hidden), SLACK_WEBHOOK_URL=(hidden), AWS_URL=(hidden), "
                          "DATABASE_URL=(hidden), MY_SETTING=(hidden), OMP_NUM_THREADS=4, NCCL_DEBUG=INFO, "
                          "CUDA_VISIBLE_DEVICES=0,1, NCCL_SOCKET_IFNAME=(hidden)")


def test_a_jobs_record_keeps_names_only():
    env = (("OMP_NUM_THREADS", "4"), ("DATABASE_URL", "postgres://u:p/ss@h/db"), ("MY_SETTING", "s3cr3tq"))
    state = ClusterState("lab", "img:1", "sha256:abc", 12345, "/w",
                         hosts=[HostState("a", "10.0.0.1", Place("kit-lab", "/var/lib/kit/lab"), primary=True)])
    job = Job("j1", state, 1, (Slot("a", "10.0.0.1", 1),), (), ("python", "-u", "t.py"), env=env)
    request = json.loads(job.request(None))
    assert request["files"]["environment"] == "OMP_NUM_THREADS, DATABASE_URL, MY_SETTING"
    kept = json.dumps(request["files"])  # everything the job's folder keeps, its plan included
    assert not re.search(r"s3cr3tq|u:p/ss|=4\b", kept), kept
    assert json.loads(request["env_file"]) == dict(env)  # the ranks still get the values, from their 0600 file
