"""This machine's pip configuration as kit reads it: pip's own files and variables, the order `pip download`
applies, kit.yaml's explicit sources on top, credentials never printed."""

import os
from pathlib import Path

import pytest

from kit import redact
from kit.image import pipconfig
from kit.image.pipconfig import PipSettings, for_download, parse_config_list

# Captured from `pip config list` on a machine with a user pip.conf, a global one and PIP_* variables.
CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
download.timeout='5'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='\\nhttps://b.example/simple\\nhttps://c.example/simple'
global.index-url='https://a.example/simple'
install.index-url='https://inst.example/simple'
"""


def test_pip_config_list_is_parsed_with_its_quoting():
    items = parse_config_list(CONFIG_LIST)
    assert items[("global", "extra-index-url")] == "\nhttps://b.example/simple\nhttps://c.example/simple"
    assert items[(":env:", "find-links")] == "/opt/wheels"
    assert items[("install", "index-url")] == "https://inst.example/simple"


def test_download_sees_global_then_download_then_variables_and_not_install():
    values = for_download(parse_config_list(CONFIG_LIST))
    assert values["index-url"] == "https://a.example/simple"  # [install] is another command's
    assert values["timeout"] == "180"  # [global] < [download] (5) < PIP_DEFAULT_TIMEOUT (180)
    s = PipSettings(values)
    assert s.indexes == ("https://a.example/simple", "https://b.example/simple", "https://c.example/simple")
    assert s.find_links == ("/opt/wheels",) and s.constraints == ("/etc/xdg/pip/constraints.txt",)
    assert s.cert == "/etc/ssl/certs/ca-certificates.crt"


def test_empty_values_override_nothing_and_several_lines_are_one_list():
    """As pip reads them: an empty [download] value leaves [global]'s; a value of several lines is a list."""
    items = parse_config_list("download.no-index=''\nglobal.no-index='yes'\n"
                              "global.extra-index-url='\\nhttps://b/simple\\nhttps://u:p@c/simple'\n")
    s = PipSettings(for_download(items))
    assert s.no_index and PipSettings({"no-index": "t"}).no_index
    assert s.values["extra-index-url"] == "https://b/simple https://u:p@c/simple"
    assert "extra-index-url = https://b/simple https://u:p@c/simple\n" in s.config_file()


def test_no_index_and_the_default_index():
    assert PipSettings({}).indexes == ("https://pypi.org/simple",)
    assert PipSettings({"no-index": "1", "extra-index-url": "https://x/simple"}).indexes == ()
    assert "index https://pypi.org/simple (pip's default)" in PipSettings({}).describe()


def test_kit_yaml_indexes_replace_pips_and_wheelhouse_and_torch_index_add_to_them():
    machine = PipSettings({"index-url": "https://a/simple", "extra-index-url": "https://b/simple",
                           "find-links": "/opt/wheels", "no-index": "true"})
    s = machine.with_overrides(index_urls=("https://mirror/simple",), find_links=("/srv/wheels",))
    assert s.indexes == ("https://mirror/simple",) and not s.no_index
    assert s.find_links == ("/srv/wheels", "/opt/wheels")
    assert s.overridden == ("index-url", "extra-index-url", "find-links")
    t = s.with_overrides(extra_index_urls=("https://download.pytorch.org/whl/cpu",))
    assert t.indexes == ("https://mirror/simple", "https://download.pytorch.org/whl/cpu")
    kept = PipSettings({"extra-index-url": "https://b/simple"}).with_overrides(extra_index_urls=("https://t/cpu",))
    assert kept.extra_index_urls == ("https://b/simple", "https://t/cpu")


def test_the_config_file_of_the_resolution_says_everything_in_both_sections():
    text = PipSettings({"index-url": "https://u:p@a/simple", "extra-index-url": ""}).config_file()
    assert text == ("[global]\nextra-index-url = \nindex-url = https://u:p@a/simple\n\n"
                    "[download]\nextra-index-url = \nindex-url = https://u:p@a/simple\n")


@pytest.mark.parametrize("url, shown", [
    ("https://user:s3cret@pypi.lab/simple", "https://****@pypi.lab/simple"),
    ("https://s3cret@pypi.lab:8443/simple/", "https://****@pypi.lab:8443/simple/"),
    ("https://u:s3cret@[fd00::7]:8443/simple", "https://****@[fd00::7]:8443/simple"),
    ("http://u:s3cret@proxy.lab:notaport", "http://****"),  # cannot be taken apart: shown as nothing
    ("u:s3cret@proxy.lab:3128", "****@proxy.lab:3128"),  # a proxy written without a scheme
    ("git+https://github.com/horovod/horovod@3a31d93", "git+https://github.com/horovod/horovod@3a31d93"),
    ("https://pypi.org/simple", "https://pypi.org/simple"),
    ("/opt/wheels", "/opt/wheels"),
])
def test_credentials_are_never_printed(url, shown):
    assert redact.redact(url) == shown
    assert redact.has_credentials(url) == (url != shown)
    settings = PipSettings({"index-url": url, "proxy": url, "constraint": url, "find-links": url})
    assert "s3cret" not in " ".join(settings.describe())


def test_the_resolutions_pip_gets_its_settings_from_the_file_only():
    env = pipconfig.run_env({"PATH": "/bin", "PIP_INDEX_URL": "https://a", "PIP_FIND_LINKS": "/w"}, Path("/t/pip.conf"))
    assert env == {"PATH": "/bin", "PIP_CONFIG_FILE": "/t/pip.conf"}


def test_the_ca_bundle_is_pips_cert_then_requests_then_ssl(tmp_path):
    a, b = tmp_path / "a.pem", tmp_path / "b.pem"
    a.write_text("x")
    b.write_text("y")
    assert pipconfig.ca_file(PipSettings({"cert": str(a)}), {"SSL_CERT_FILE": str(b)}) == a
    assert pipconfig.ca_file(PipSettings({}), {"REQUESTS_CA_BUNDLE": str(b), "SSL_CERT_FILE": str(a)}) == b
    assert pipconfig.ca_file(PipSettings({}), {"SSL_CERT_FILE": str(a)}) == a
    assert pipconfig.ca_file(PipSettings({"cert": str(tmp_path / "missing")}), {}) is None


# ---------------------------------------------------------------- with this machine's real pip

def real_pip_env(home: Path, **variables: str) -> dict[str, str]:
    """An environment whose user config lives in `home` and whose PIP_* variables are only the given ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), **variables}


def test_real_pip_user_file_download_section_and_variables(tmp_path):
    user = tmp_path / ".config" / "pip" / "pip.conf"
    user.parent.mkdir(parents=True)
    user.write_text("[global]\nindex-url = https://user.example/simple\nfind-links = /srv/a\ntimeout = 7\n"
                    "[download]\nfind-links = /srv/download\n[install]\nfind-links = /srv/install\n")
    s = pipconfig.read(env=real_pip_env(tmp_path, PIP_EXTRA_INDEX_URL="https://env.example/simple"))
    assert s.index_url == "https://user.example/simple"
    assert s.extra_index_urls == ("https://env.example/simple",)
    assert s.find_links == ("/srv/download",)
    assert s.values["timeout"] == "7"


def test_real_pip_config_file_variable_wins_over_the_user_file(tmp_path):
    user = tmp_path / ".config" / "pip" / "pip.conf"
    user.parent.mkdir(parents=True)
    user.write_text("[global]\nindex-url = https://user.example/simple\ntrusted-host = user.example\n")
    named = tmp_path / "named.conf"
    named.write_text("[global]\nindex-url = https://named.example/simple\n")
    s = pipconfig.read(env=real_pip_env(tmp_path, PIP_CONFIG_FILE=str(named)))
    assert s.index_url == "https://named.example/simple"
    assert "user.example" not in s.trusted_hosts  # pip skips the user's files when PIP_CONFIG_FILE names one
    s = pipconfig.read(env=real_pip_env(tmp_path, PIP_CONFIG_FILE=str(named), PIP_INDEX_URL="https://var/simple"))
    assert s.index_url == "https://var/simple"


def test_the_written_file_gives_real_pip_exactly_kit_yamls_sources(tmp_path):
    """Round trip: what kit writes for its own pip run is what that pip then reads, kit.yaml's index first."""
    user = tmp_path / ".config" / "pip" / "pip.conf"
    user.parent.mkdir(parents=True)
    user.write_text("[global]\nindex-url = https://user.example/simple\nextra-index-url = https://extra.example/s\n"
                    "[download]\nindex-url = https://download.example/simple\n")
    env = real_pip_env(tmp_path, PIP_FIND_LINKS="/opt/wheels")
    machine = pipconfig.read(env=env)
    assert machine.index_url == "https://download.example/simple" and machine.find_links == ("/opt/wheels",)
    mine = machine.with_overrides(index_urls=("https://kit.example/simple",))
    conf = tmp_path / "kit-pip.conf"
    conf.write_text(mine.config_file())
    again = pipconfig.read(env=pipconfig.run_env(env, conf))
    assert again.indexes == ("https://kit.example/simple",)
    assert again.find_links == ("/opt/wheels",)


def test_a_value_of_several_lines_reaches_the_resolutions_pip_whole(tmp_path):
    """pip.conf's usual way to list extra indexes: one URL a line. kit's file for its own pip must keep them all."""
    user = tmp_path / ".config" / "pip" / "pip.conf"
    user.parent.mkdir(parents=True)
    user.write_text("[global]\nextra-index-url =\n    https://b.example/simple\n    https://u:p@c.example/simple\n")
    env = real_pip_env(tmp_path)
    machine = pipconfig.read(env=env)
    assert machine.extra_index_urls == ("https://b.example/simple", "https://u:p@c.example/simple")
    conf = tmp_path / "kit-pip.conf"
    conf.write_text(machine.config_file())
    assert pipconfig.read(env=pipconfig.run_env(env, conf)).extra_index_urls == machine.extra_index_urls


def test_a_broken_pip_configuration_is_named(tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_text("this is not ini\n")
    with pytest.raises(pipconfig.KitError, match="cannot ask pip for its configuration") as e:
        pipconfig.read(env=real_pip_env(tmp_path, PIP_CONFIG_FILE=str(bad)))
    assert e.value.hint and "pip config debug" in e.value.hint

