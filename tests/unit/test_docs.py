"""The documentation: README.md as a short front page whose links resolve, and the MkDocs site in docs/, built
strictly and offline, whose reference pages hold every kit.yaml key, every command and flag and every doctor
check that kit's code has. The code is read here on other paths than the site's generator (docs/hooks/kitref.py)
takes: config.py's syntax tree, `kit --help` as a user runs it, the doctor's text."""

from __future__ import annotations

import ast
import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
QUICKSTART = "## Quickstart on your servers"


# ---------------------------------------------------------------- the site, built once

def _offline() -> list[str]:
    """A prefix that runs a command with no network at all (a network namespace of its own), where this machine
    allows one; else none, and the built pages are still checked for anything they would fetch."""
    unshare = shutil.which("unshare")
    for argv in ([unshare, "--net"], [unshare, "--user", "--map-root-user", "--net"]):
        if unshare and subprocess.run([*argv, "true"], capture_output=True).returncode == 0:
            return argv
    return []


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([*_offline(), sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text() if name else (site / "index.html").read_text()


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def text_of(markup: str) -> str:
    parser = _Text()
    parser.feed(markup)
    return re.sub(r"\s+", " ", "".join(parser.parts))


def section(markup: str, anchor: str, level: str = "h2") -> str:
    """The page from the heading with this id to the next heading of the same level."""
    start = markup.index(f'id="{anchor}"')
    end = markup.find(f"<{level}", start)
    return markup[start:end if end > 0 else len(markup)]


def test_the_site_builds_strictly_without_the_network(site):
    """`mkdocs build --strict` (every link and anchor resolves, no warning) passed in the fixture, with no network
    where the machine allows a namespace without one; no page loads anything from another host (fonts, scripts)."""
    pages = list(site.rglob("*.html"))
    assert len(pages) >= 12
    remote = re.compile(r"""<(?:link|script|img)\b[^>]*\b(?:href|src)=["']?(?:https?:)?//""", re.I)
    fetching = {str(p.relative_to(site)): remote.findall(p.read_text()) for p in pages}
    assert not {p: f for p, f in fetching.items() if f}, "pages that load from another host"
    assert "fonts.googleapis" not in "".join(p.read_text() for p in site.rglob("*.css"))


def test_pages_include_what_they_name_from_the_repository(site):
    """SECURITY.md is the security page, README's requirements and quickstart are on the front page."""
    security = text_of(page(site, "security"))
    for line in (REPO / "SECURITY.md").read_text().splitlines():
        if line.startswith("## "):
            assert line[3:] in security
    front = text_of(page(site, ""))
    assert "Quickstart on your servers" in front \
        and "kit run examples/cifar10_cnn_horovod.py --epochs 2 --samples 10000" in front
    assert "580 or newer" in front and "525 or newer" in front


# ---------------------------------------------------------------- kit.yaml: every key

def _config_models() -> dict[str, list[str]]:
    """Section (or nested path) -> its keys, from the syntax trees of config.py and its models' modules: SECTIONS'
    classes, their annotated fields, and the fields of models that a field's annotation names."""
    tree = ast.parse((REPO / "cli/kit/config/settings.py").read_text())
    models = [ast.parse((REPO / f"cli/kit/config/{m}.py").read_text()) for m in ("build", "cluster", "slurm")]
    classes = {n.name: n for t in (tree, *models) for n in t.body if isinstance(n, ast.ClassDef)}
    sections = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "SECTIONS" for t in n.targets))
    found: dict[str, list[str]] = {}

    def fields(path: str, cls: ast.ClassDef) -> None:
        found[path] = []
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and \
                    "ClassVar" not in ast.unparse(stmt.annotation) and stmt.target.id != "model_config":
                found[path].append(stmt.target.id)
                for name in {n.id for n in ast.walk(stmt.annotation) if isinstance(n, ast.Name)} & classes.keys():
                    fields(f"{path}-{stmt.target.id}", classes[name])

    for key, value in zip(sections.keys, sections.values):
        fields(key.value, classes[value.id])
    return found


def test_every_kit_yaml_key_is_in_the_reference(site):
    markup = page(site, "reference/kit-yaml")
    models = _config_models()
    assert {"build", "cluster"} <= models.keys() and "cuda" in models["build"] and "gpus" in models["cluster"]
    missing = [f"{path}.{key}" for path, keys in models.items() for key in keys if f'id="{path}-{key}"' not in markup]
    assert not missing, "keys of config.py the kit.yaml reference lacks"


def test_every_hint_of_config_is_in_the_reference(site):
    """The fix kit prints for a bad value of each key is the form the reference shows."""
    from kit.config.settings import HINTS

    shown = text_of(page(site, "reference/kit-yaml"))
    missing = {k: h for k, h in HINTS.items() if h.replace("`", "") not in shown}
    assert not missing


# ---------------------------------------------------------------- commands: every one, every flag

def _help(argv: list[str]) -> str:
    importlib.import_module("kit.app")  # importing it adds every command to the app
    from kit.cli.common import app

    r = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert r.exit_code == 0, r.output
    return r.output


def _block(help_text: str, title: str) -> list[str]:
    """The lines of one block of --help (`Options:`, `Arguments:`, `Commands:`)."""
    m = re.search(rf"^{title}:\n((?:[ \t]+.*\n?|\n)*)", help_text, re.M)
    return m[1].splitlines() if m else []


def cli_as_help_shows_it(argv: list[str] | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """'kit bench net' -> (its flags, its arguments), for kit and every command under it, as --help lists them."""
    argv = argv or []
    shown = _help(argv)
    firsts = [re.split(r"\s{2,}", line.strip())[0] for line in _block(shown, "Options")
              if re.match(r"\s+-", line)]
    flags = [f for first in firsts for f in re.findall(r"(?<![\w<])--?[A-Za-z0-9][\w-]*", first)]
    args = [line.split()[0].rstrip(".") for line in _block(shown, "Arguments") if re.match(r"\s{2}\S", line)]
    found = {" ".join(["kit", *argv]): (flags, args)}
    for line in _block(shown, "Commands"):
        if re.match(r"\s{2}\S", line):
            found.update(cli_as_help_shows_it([*argv, line.split()[0]]))
    return found


def test_every_command_and_every_flag_is_in_the_reference(site):
    markup = page(site, "reference/commands")
    commands = cli_as_help_shows_it()
    assert {"kit", "kit run", "kit up", "kit attach", "kit bench net"} <= commands.keys()
    assert "--env-file" in commands["kit run"][0] and "-c" in commands["kit up"][0]
    headings = re.findall(r'<h2 id="([^"]+)"', markup)
    anchors = {name: re.sub(r"[^a-z0-9]+", "-", name) for name in commands}
    assert sorted(anchors.values()) == sorted(h for h in headings if h.startswith("kit")), \
        "the reference's commands are not those of `kit --help`"
    missing = {}
    for name, (flags, args) in commands.items():
        own = text_of(section(markup, anchors[name]))
        missing.update({f"{name} {f}": "" for f in flags + args if not re.search(rf"(?<![\w-]){re.escape(f)}\b", own)})
    assert not missing, "flags and arguments of --help the commands reference lacks"


# ---------------------------------------------------------------- troubleshooting: every doctor check

def test_every_doctor_check_is_in_troubleshooting(site):
    source = "".join((REPO / f"cli/kit/doctor/{name}.py").read_text() for name in ("check", "judge", "network"))
    named = set(re.findall(r'Finding\(\s*[\w.\[\]]+,\s*"([^"]+)"', source))
    named |= set(re.findall(r'_disk\(\s*[\w.]+,\s*"([^"]+)"', source))  # its helper: the check's name is its 2nd
    assert {"ssh", "docker disk", "shm", "ssh mesh", "gpu"} <= named
    markup = page(site, "troubleshooting")
    missing = [c for c in named if f'id="check-{re.sub(r"[^a-z0-9]+", "-", c)}"' not in markup]
    assert not missing, "doctor checks the troubleshooting page lacks"
    shm = text_of(section(markup, "check-shm", "h3"))
    assert "fail" in shm and "warn" in shm and "set cluster.shm_size: 8g" in shm


# ---------------------------------------------------------------- the generator's own parts

@pytest.fixture(scope="module")
def kitref():
    spec = importlib.util.spec_from_file_location("kitref", REPO / "docs/hooks/kitref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_text_is_shown_as_written_in_markdown(kitref):
    assert kitref.text("use <commit> | a*b* or `x|y` and [1, 2]_") == \
        r"use &lt;commit&gt; &#124; a\*b\* or `x|y` and \[1, 2\]\_"


def test_doctor_checks_are_read_with_the_values_of_their_helpers(kitref, tmp_path):
    (tmp_path / "checks.py").write_text('''
HINT = "free some space"

def _disk(host, what, free):
    level = FAIL if free < 1 else WARN if free < 5 else OK
    return Finding(host, what, level, f"{free} GiB free", "" if level == OK else HINT)

def judge(r):
    text = f"{r.mtu} bytes"
    return [_disk(r.name, "docker disk", r.free), _disk(r.name, "workspace disk", r.ws),
            Finding(r.name, "nic", OK if r.same else FAIL, text + ("" if r.same else ": differs"), "set one MTU")]
''')
    found = kitref.doctor_checks(tmp_path)
    assert list(found) == ["docker disk", "workspace disk", "nic"]
    assert found["docker disk"] == {"ok": [("… GiB free", "")], "warn": [("… GiB free", "free some space")],
                                    "fail": [("… GiB free", "free some space")]}
    assert found["nic"] == {"ok": [("… bytes", "")], "fail": [("… bytes: differs", "set one MTU")]}


def test_a_finding_whose_words_a_helper_returns_shows_each_of_its_answers(kitref, tmp_path):
    (tmp_path / "checks.py").write_text('''
def problem(old, tf):
    whose = "TensorFlow's CUDA" if tf else "the image's CUDA"
    if old < 3:
        return (f"driver {old} is too old for {whose}", "install a newer driver")
    return None

def judge(r):
    found = problem(r.old, r.tf)
    if found:
        return [Finding(r.name, "cuda", FAIL, *found)]
    return [Finding(r.name, "cuda", OK, f"driver {r.old} runs it")]
''')
    assert kitref.doctor_checks(tmp_path)["cuda"] == {
        "ok": [("driver … runs it", "")], "fail": [("driver … is too old for the image's CUDA", "install a newer driver")]}


def test_the_reference_gives_build_flavor_as_kit_yaml_reads_it(site):
    """auto (the default) and tf are decided from the hosts before the build's model sees a flavor."""
    shown = text_of(section(page(site, "reference/kit-yaml"), "build-flavor", "h3"))
    assert "one of: auto, tf, cpu, gpu, tf-cpu, tf-gpu" in shown and "default auto" in shown


# ---------------------------------------------------------------- README.md: the front page

def test_readme_is_a_short_front_page():
    text = README.read_text()
    assert len(text.splitlines()) < 250
    for heading in ("## Requirements", "## Install", QUICKSTART, "## Run the tests", "## Documentation"):
        assert re.search(rf"^{re.escape(heading)}$", text, re.M), heading
    # The two commands a new user types to set things up, shown alone on a line as they have always been
    assert re.findall(r"^ {4}(cli/demo|tests/run)$", text, re.M) == ["cli/demo", "tests/run"]
    assert not re.search(r"\bissue \d+|this machine's (2|two) cores", text, re.I)


def quickstart(text: str) -> list[str]:
    """The quickstart's commands: the one fenced block under its heading, less comments and blank lines."""
    part = text.split(QUICKSTART, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", part, re.M | re.S)
    assert len(blocks) == 1 and blocks[0][0] == "sh", "the quickstart must be one fenced block of shell commands"
    return [line for line in blocks[0][1].splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_quickstart_goes_from_servers_to_a_job_and_back():
    commands = quickstart(README.read_text())
    kit = [c for c in commands if c.startswith("kit ")]
    assert [c.split()[1] for c in kit] == ["prepare", "up", "doctor", "run", "down"]
    assert "kit run examples/cifar10_cnn_horovod.py --epochs 2 --samples 10000" in kit
    assert any("gpu-1 gpu-2 gpu-3" in c and "hosts.txt" in c for c in commands)
    assert any("pip install" in c for c in commands)
    assert (REPO / "examples/cifar10_cnn_horovod.py").is_file()


def test_readme_links_resolve(site):
    """Every relative link of README.md is a file of the repository; a link into docs/ with an anchor finds it on
    the built page."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [l for l in links if not re.match(r"[a-z]+:", l) and not l.startswith("#")]
    assert len(relative) >= 10
    for link in relative:
        path, _, anchor = link.partition("#")
        assert (REPO / path).exists(), link
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            built = site / path[len("docs/"):-len(".md")] / "index.html"
            if path == "docs/index.md":
                built = site / "index.html"
            assert f'id="{html.escape(anchor)}"' in built.read_text(), link
