"""kit.yaml and flags -> validated, frozen settings.

Values come from two places: kit.yaml (each remembered with its line) and
command-line flags, which win. Validation happens once, when this module
merges them into a section's model (kit.config.build, kit.config.cluster,
kit.config.slurm), and its errors are mapped here: every error
names where the bad value came from (`kit.yaml:7` or `--wheelhouse`) and the
form that is expected, and is raised before anything touches Docker or a host.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from kit.config import build as buildconfig
from kit.config import cluster as clusterconfig
from kit.config import slurm as slurmconfig
from kit.config.build import GPU_ONLY, NO_CREDENTIALS, BuildConfig
from kit.config.cluster import ClusterConfig
from kit.errors import BadInput, read_input
from kit.image.flavors import AUTO_FLAVORS, CONTENTS, CUDA_LINES, FLAVORS, cuda_line, framework, uses_gpus
from kit.redact import text as redact_text
from kit.config.slurm import SlurmConfig

# The models live in kit.image.flavors, kit.config.build, kit.config.cluster and kit.config.slurm (none imports this module);
# the names their many importers take from here stay here.
__all__ = ["AUTO_FLAVORS", "CONTENTS", "CUDA_LINES", "FLAVORS", "BuildConfig", "ClusterConfig", "SlurmConfig",
           "cuda_line", "framework", "uses_gpus"]

DEFAULT_CONFIG = Path("kit.yaml")

# The fix shown for a bad value of each setting: the expected form, with an example.
HINTS: dict[str, str] = {**buildconfig.HINTS, **clusterconfig.HINTS, **slurmconfig.HINTS}


# ---------------------------------------------------------------- kit.yaml

SECTIONS = {"build": BuildConfig, "cluster": ClusterConfig, "slurm": SlurmConfig}


@dataclass(frozen=True)
class ConfigFile:
    """kit.yaml as read: each section's values and the line of every key."""

    path: Path | None = None
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    lines: dict[tuple[str, str], int] = field(default_factory=dict)
    written: dict[tuple[str, str], Any] = field(default_factory=dict)  # a YAML number's own text (_written)

    def where(self, section: str, key: str | None = None) -> str:
        line = self.lines.get((section, key or ""), self.lines.get((section, "")))
        return f"{self.path}:{line}" if line else str(self.path)


def read_config(path: Path | None) -> ConfigFile:
    """Read kit.yaml: the given path (which must exist) or ./kit.yaml when present."""
    if path is None:
        if not DEFAULT_CONFIG.is_file():
            return ConfigFile()
        path = DEFAULT_CONFIG
    text = read_input(path, "config file", hint="pass --config with the path of a readable kit.yaml")
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise BadInput(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})",
                       hint="fix the YAML syntax (indent with spaces, `key: value` pairs)") from None
    return _read_sections(path, root)


def _read_sections(path: Path, root: yaml.Node | None) -> ConfigFile:
    cfg = ConfigFile(path=path)
    if root is None:
        return cfg
    if not isinstance(root, yaml.MappingNode):
        raise BadInput(f"{path}:{root.start_mark.line + 1}: the file must be a mapping of sections",
                       hint=f"start with a section name, e.g. `build:`; sections: {', '.join(SECTIONS)}")
    for key_node, value_node in root.value:
        name, line = key_node.value, key_node.start_mark.line + 1
        if name not in SECTIONS:
            raise BadInput(f"{path}:{line}: unknown section '{name}'",
                           hint=f"sections are: {', '.join(SECTIONS)}")
        if not isinstance(value_node, yaml.MappingNode):
            raise BadInput(f"{path}:{line}: section '{name}' must be a mapping of settings",
                           hint=f"indent `key: value` lines under `{name}:`")
        cfg.lines[(name, "")] = line
        for k, v in value_node.value:
            cfg.lines[(name, k.value)] = k.start_mark.line + 1
            if (text := _written(v)) is not None:
                cfg.written[(name, k.value)] = text
        cfg.sections[name] = yaml.safe_load(yaml.serialize(value_node)) or {}
    return cfg


_NOT_TEXT = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")


def _written(node: yaml.Node) -> str | list[str | None] | None:
    """How a value YAML reads as a number or a boolean was written (`python: 3.10` is the float 3.1 to YAML): the
    scalar's own text; for a list, each item's (None for text). None when the value is text (or no scalar)."""
    if isinstance(node, yaml.ScalarNode):
        return node.value if node.tag in _NOT_TEXT else None
    if isinstance(node, yaml.SequenceNode):
        items = [_written(item) if isinstance(item, yaml.ScalarNode) else None for item in node.value]
        return items if any(item is not None for item in items) else None
    return None


def _types(annotation: Any) -> set:
    """The types a field's values may have: `str | None` -> {str}, Literal["a", "b"] -> {str}, tuple[str, ...] ->
    {str}."""
    if get_origin(annotation) is Literal:
        return {type(arg) for arg in get_args(annotation)}
    if get_origin(annotation) in (Union, UnionType, tuple, list):
        return set().union(*(_types(arg) for arg in get_args(annotation) if arg is not Ellipsis))
    return set() if annotation is type(None) else {annotation}


def wants_text(model: type[BaseModel], key: str) -> bool:
    """Whether a setting is text (a version, a size, a name): then a YAML number there means what it was written as."""
    found = model.model_fields.get(key)
    kinds = _types(found.annotation) if found is not None else set()
    return bool(kinds) and kinds <= {str, Path}


_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d+)*")  # 3.10, 12.8, 8: as written, there is only one way to read it


def as_written(value: Any, written: str | list | None, where: str, key: str) -> Any:
    """A text setting given as a YAML number or boolean: its text as the user wrote it (3.10, not 3.1), or, where
    that text reads otherwise to YAML (1e3, 0x1f, 1_000, 1:30, yes), refused with the quoted form to write."""
    if isinstance(written, list) and isinstance(value, list):
        return [as_written(v, w, where, key) for v, w in zip(value, written)]
    if not isinstance(written, str):
        return value
    if _PLAIN_NUMBER.fullmatch(written):
        return written
    what = f"the boolean {str(value).lower()}" if isinstance(value, bool) else f"the number {value!r}"
    raise BadInput(f"{where}: {written} reads as {what} in YAML, not as the text {written}",
                   hint=f'quote it if you mean the text: write {key}: "{written}"')


# ---------------------------------------------------------------- merging

PATH_FIELDS = {"wheelhouse", "ca_bundle"}


# Settings whose flag is not their name with dashes (a flag given once a value: --pip tqdm --pip six).
FLAGS = {"pip_packages": "--pip", "apt_packages": "--apt", "pip_index_urls": "--index-url", "cuda_archs": "--cuda-arch"}


def flag_name(field_name: str) -> str:
    return FLAGS.get(field_name, "--" + field_name.replace("_", "-"))


def build_config(cfg: ConfigFile, flags: dict[str, Any]) -> BuildConfig:
    """Merge kit.yaml's build section with flags (flags win) and validate."""
    return section_config(cfg, "build", flags)


def requested_flavor(cfg: ConfigFile, flag: str | None = None) -> tuple[str, str]:
    """build.flavor as asked (--flavor, else kit.yaml, else auto) and where it was asked: a flavor, or one of
    AUTO_FLAVORS that the caller decides from the hosts' GPUs before build_config."""
    if flag is not None:
        value, where = flag, "--flavor"
    elif "flavor" in cfg.sections.get("build", {}):
        value, where = cfg.sections["build"]["flavor"], f"{cfg.where('build', 'flavor')}: build.flavor"
    else:
        return "auto", "build.flavor (default auto)"
    if value not in FLAVORS and value not in AUTO_FLAVORS:
        raise BadInput(f"{where}: {value!r} is not allowed", hint=HINTS["flavor"])
    return value, where


def cluster_config(cfg: ConfigFile, flags: dict[str, Any]) -> ClusterConfig:
    return section_config(cfg, "cluster", flags)


def section_config(cfg: ConfigFile, section: str, flags: dict[str, Any]):
    model = SECTIONS[section]
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in cfg.sections.get(section, {}).items():
        where = f"{cfg.where(section, key)}: {section}.{key}"
        if (section, key) in cfg.written and wants_text(model, key):
            value = as_written(value, cfg.written[(section, key)], where, key)
        if key in PATH_FIELDS and isinstance(value, str):
            value = (cfg.path.parent / value).expanduser()  # relative to kit.yaml, like compose files
        values[key], origin[key] = value, where
    for key, value in flags.items():
        if value is not None and value != ():
            values[key], origin[key] = value, flag_name(key)
    try:
        return model(**values)
    except ValidationError as e:
        raise _bad_input(e, origin, cfg, section) from None


def _bad_input(e: ValidationError, origin: dict[str, str], cfg: ConfigFile, section: str) -> BadInput:
    err = e.errors()[0]
    key = str(err["loc"][0]) if err["loc"] else ""
    where = origin.get(key) or (f"{cfg.where(section)}: {section}" if cfg.path else f"{section} settings")
    msg = err["msg"].removeprefix("Value error, ")
    hint = HINTS.get(key, f"see the README for the settings of {section}")
    if msg.startswith("does not apply to flavor"):
        hint = f"remove {key}, or use " + ("flavor gpu" if key in GPU_ONLY else "a flavor whose image has it")
    if NO_CREDENTIALS in msg:
        msg, hint = msg.replace(f": {NO_CREDENTIALS}", ""), f"remove it from the URL: {NO_CREDENTIALS}"
    if err["type"] == "extra_forbidden":
        msg, hint = "unknown setting", f"settings of {section} are: {', '.join(SECTIONS[section].model_fields)}"
    elif err["type"] == "literal_error":
        msg = f"'{err['input']}' is not allowed"
    elif err["type"] == "tuple_type":
        msg = f"should be a list, e.g. [{err.get('input')}] (got {err.get('input')!r})"
    elif err["type"] in ("string_type", "bool_parsing", "bool_type", "int_parsing", "int_type", "missing"):
        msg = f"{msg.lower()} (got {err.get('input')!r})"
    return BadInput(redact_text(f"{where}: {msg}"), hint=hint)


def set_setting(cfg: ConfigFile, section: str, key: str, value: str) -> Path:
    """Write `key: value` into kit.yaml's section, changing no other line (comments and order kept): the key's own
    line where it has one, else a line under the section's, else the section at the end; a new ./kit.yaml where
    there is none. The file is read back as kit reads it; where the edit cannot be made so (a section written
    `{...}` on one line), or reads back otherwise, the file is left as it was and BadInput says the line to add."""
    path = cfg.path or DEFAULT_CONFIG
    line = f"{key}: {json.dumps(value)}"
    fix = BadInput(f"{path}: kit could not set {section}.{key} itself",
                   hint=f"add `{line}` under `{section}:` in {path}")
    old = path.read_text() if path.is_file() else ""
    lines = old.splitlines(keepends=True)
    own, head = cfg.lines.get((section, key)), cfg.lines.get((section, ""))
    if head is not None and "{" in lines[head - 1].split("#", 1)[0]:
        raise fix  # (flow style: `slurm: {login: x}`)
    if own is not None:
        text = lines[own - 1]
        lines[own - 1] = f"{text[:len(text) - len(text.lstrip())]}{line}\n"
    elif head is not None:
        others = sorted(n for (s, k), n in cfg.lines.items() if s == section and k)
        text = lines[others[0] - 1] if others else ""
        lines.insert(head, f"{text[:len(text) - len(text.lstrip())] or '  '}{line}\n")
    else:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.append(f"{section}:\n  {line}\n")
    path.write_text("".join(lines))
    try:
        if read_config(path).sections.get(section, {}).get(key) != value:
            raise fix
    except BadInput:
        if old:
            path.write_text(old)
        else:
            path.unlink()
        raise fix from None
    return path
