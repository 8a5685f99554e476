"""Package sources are asked first, within a bound, on loopback only: one that does not answer is named at once,
torch's own default index may be missing, and what kit.yaml names wins."""

import http.server
import threading
import time

import pytest

from helpers import closed_port, silent_listener
from kit.image import probe
from kit.image.build import package_sources
from kit.config.settings import ConfigFile, build_config
from kit.errors import KitError
from kit.image.pipconfig import PipSettings

NO_SETTINGS = PipSettings({})


class Index(http.server.BaseHTTPRequestHandler):
    """A private index: 401 to a question without a credential; /moved redirects elsewhere. Remembers what it
    was asked, and with which Authorization header."""

    seen: list[tuple[str, str]] = []

    def do_HEAD(self):
        Index.seen.append((self.path, self.headers.get("Authorization", "")))
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere/")
        else:
            self.send_response(401)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Index.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent():
    sock = silent_listener()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/simple"
    sock.close()


def test_an_index_that_answers_anything_answers(index):
    assert probe.probe(f"{index}/simple/", NO_SETTINGS, {}) is None  # a 401
    assert probe.probe(f"{index}/moved/", NO_SETTINGS, {}) is None  # a redirect, not followed
    assert [path for path, _ in Index.seen] == ["/simple/", "/moved/"]


def test_the_question_carries_no_credential(index):
    """Only pip talks to an index with its credential; kit's question needs none (any answer will do)."""
    assert probe.probe(f"http://kit:s3cret@{index.removeprefix('http://')}/simple/", NO_SETTINGS, {}) is None
    assert Index.seen == [("/simple/", "")]


def test_a_url_urllib_cannot_use_is_named_not_raised():
    assert probe.probe("http://u:p@host:notaport/simple", NO_SETTINGS, {}).startswith("not a URL kit can ask")


def test_a_closed_port_and_a_silent_one_are_named_within_the_bound(silent):
    assert probe.probe(f"http://127.0.0.1:{closed_port()}/simple", NO_SETTINGS, {}) == "the connection was refused"
    started = time.monotonic()
    assert probe.probe(silent, NO_SETTINGS, {}, timeout=1) == "no answer within 1 s"
    assert time.monotonic() - started < 5


def test_local_folders_and_file_urls(tmp_path):
    assert probe.probe(str(tmp_path), NO_SETTINGS, {}) is None
    assert probe.probe(f"file://{tmp_path}", NO_SETTINGS, {}) is None
    assert probe.probe(f"file://{tmp_path}/nope", NO_SETTINGS, {}) == f"{tmp_path}/nope does not exist"


def test_every_source_is_asked_at_once(silent):
    started = time.monotonic()
    answers = probe.probe_all([silent, silent + "/a", silent + "/b"], NO_SETTINGS, {}, timeout=1)
    assert time.monotonic() - started < 3 and set(answers.values()) == {"no answer within 1 s"}


# ---------------------------------------------------------------- the decision, with the answers given

def answers(silent_urls: dict[str, str]):
    def probe_all(urls, settings, env):
        return {u: silent_urls.get(u) for u in urls}
    return probe_all


TORCH_PROBE = "https://download.pytorch.org/whl/cpu/torch/"


def test_torch_index_is_added_when_it_answers():
    settings, notes = package_sources(build_config(ConfigFile(), {}), NO_SETTINGS, {}, probe_all=answers({}))
    assert settings.indexes == ("https://pypi.org/simple", "https://download.pytorch.org/whl/cpu") and notes == []


def test_a_silent_default_torch_index_is_left_out_with_a_note():
    settings, notes = package_sources(build_config(ConfigFile(), {}), NO_SETTINGS, {},
                                      probe_all=answers({TORCH_PROBE: "the name download.pytorch.org does not resolve"}))
    assert settings.indexes == ("https://pypi.org/simple",)
    assert notes == ["torch's index https://download.pytorch.org/whl/cpu does not answer (the name "
                     "download.pytorch.org does not resolve): torch comes from pip's sources"]


def test_a_silent_default_index_of_the_cuda_line_is_left_out_too():
    """The gpu flavor's default index is its CUDA line's; PyPI's torch (and a 12.8 line's +cu128) may come instead."""
    for cuda, index in (("13.0", "cu130"), ("12.8", "cu128")):
        url = f"https://download.pytorch.org/whl/{index}"
        settings, notes = package_sources(build_config(ConfigFile(), {"flavor": "gpu", "cuda": cuda}), NO_SETTINGS, {},
                                          probe_all=answers({f"{url}/torch/": "refused"}))
        assert settings.indexes == ("https://pypi.org/simple",)
        assert notes == [f"torch's index {url} does not answer (refused): torch comes from pip's sources"]


def test_a_silent_torch_index_that_kit_yaml_names_stops_the_build():
    cfg = build_config(ConfigFile(), {"torch_index_url": "https://torch.lab/whl/cpu"})
    with pytest.raises(KitError, match=r"build.torch_index_url https://torch.lab/whl/cpu does not answer: refused"):
        package_sources(cfg, NO_SETTINGS, {}, probe_all=answers({"https://torch.lab/whl/cpu/torch/": "refused"}))


def test_a_silent_index_of_pips_configuration_stops_the_build_naming_it_without_its_password():
    machine = PipSettings({"extra-index-url": "https://u:s3cret@pypi.lab/simple"})
    with pytest.raises(KitError) as e:
        package_sources(build_config(ConfigFile(), {}), machine, {},
                        probe_all=answers({"https://u:s3cret@pypi.lab/simple": "no answer within 10 s"}))
    assert str(e.value) == "the package source https://****@pypi.lab/simple does not answer: no answer within 10 s"
    assert "pip's configuration" in e.value.hint and "s3cret" not in e.value.hint


def test_kit_yaml_indexes_replace_the_machines_and_are_named_as_kit_yamls():
    machine = PipSettings({"index-url": "https://silent.example/simple"})
    cfg = build_config(ConfigFile(), {"pip_index_urls": ("https://mirror.lab/simple",), "torch_index_url": ""})
    settings, _ = package_sources(cfg, machine, {}, probe_all=answers({"https://silent.example/simple": "x"}))
    assert settings.indexes == ("https://mirror.lab/simple",)
    with pytest.raises(KitError, match="does not answer") as e:
        package_sources(cfg, machine, {}, probe_all=answers({"https://mirror.lab/simple": "no answer"}))
    assert "kit.yaml's build.pip_index_urls" in e.value.hint


def test_a_wheelhouse_of_kit_yaml_is_searched_first(tmp_path):
    (tmp_path / "x-1-py3-none-any.whl").write_bytes(b"w")
    cfg = build_config(ConfigFile(), {"wheelhouse": tmp_path, "flavor": "tf-cpu"})
    settings, notes = package_sources(cfg, PipSettings({"find-links": "/gone"}), {}, probe_all=answers({}))
    assert settings.find_links == (str(tmp_path), "/gone")
    assert notes == ["/gone (find-links) does not exist; pip skips it"]


def test_pips_own_default_index_that_does_not_answer_says_how_to_turn_it_off():
    with pytest.raises(KitError, match="https://pypi.org/simple does not answer") as e:
        package_sources(build_config(ConfigFile(), {"torch_index_url": ""}), PipSettings({"find-links": "/w"}), {},
                        probe_all=answers({"https://pypi.org/simple": "no answer within 10 s"}))
    assert "pip's default index" in e.value.hint and "no-index = true" in e.value.hint


def test_the_machines_proxy_reaches_the_build_as_dockers_own_build_arguments():
    from kit.image.build import proxy_args
    env = {"https_proxy": "http://proxy.lab:3128", "NO_PROXY": "localhost", "PATH": "/bin", "HTTP_PROXY": ""}
    assert proxy_args(env) == {"NO_PROXY": "localhost", "https_proxy": "http://proxy.lab:3128"}
