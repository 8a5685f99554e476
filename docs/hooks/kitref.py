"""MkDocs hook: the reference pages, written from kit's own code each time the site is built.

A page asks for a generated part with a marker line, `<!-- kit-reference: NAME -->`:

- `kit.yaml`: every section of kit.config.settings.SECTIONS, every field of its pydantic model (and of models nested in
  it), with its type, its default (per flavor where the flavor changes it), the flag that sets it, the comment
  beside it in config.py and its HINTS text;
- `commands`: every command of kit's Typer app (its click commands, walked as `kit --help` shows them) with its
  usage, its help and every option and argument, as its `--help` prints them;
- `doctor-checks`: every check of `kit doctor`, read from the `Finding(...)` calls in kit's source: what it says
  when it is ok, and each warning and failure with its fix;
- `reserved-env`: the variables a job may not set with `kit run -e` or `--env-file` (kit.jobs.env), and why.

Nothing generated is committed: a flag, key or check that someone adds is in the next build, with no edit here.
"""

from __future__ import annotations

import ast
import enum
import html
import inspect
import io
import re
import tokenize
import typing
from pathlib import Path
from typing import Any, Callable, Iterator

MARKER = re.compile(r"^<!-- kit-reference: (\S+) -->$", re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    def generated(m: re.Match) -> str:
        if m[1] not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown reference marker {m[1]!r} "
                             f"(known: {', '.join(GENERATORS)})")
        return GENERATORS[m[1]]()
    return MARKER.sub(generated, markdown)


# ---------------------------------------------------------------- Markdown text

_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def text(s: str) -> str:
    """Plain text (help, hints, comments) as Markdown: backtick spans stay code, everything else is shown as
    written (no emphasis, no HTML, no table cell ends)."""
    out, last = [], 0
    for m in _CODE.finditer(s):
        out += [_plain(s[last:m.start()]), m[0]]
        last = m.end()
    out.append(_plain(s[last:]))
    return "".join(out).replace("\n", " ")


def _plain(s: str) -> str:
    s = html.escape(s, quote=False).replace("|", "&#124;")
    return re.sub(r"([\\*_\[\]])", r"\\\1", s)


def code(s: str) -> str:
    """A code span that holds any text (backticks in it, a leading or trailing one)."""
    fence = "`" * (max((len(r) for r in re.findall("`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- kit.yaml

def config_reference() -> str:
    from kit.config import settings as config

    parts = []
    for section, model in config.SECTIONS.items():
        parts += [f"## `{section}:` {{#{section}}}", "", text(inspect.getdoc(model) or ""), "",
                  _model_keys(model, section, config)]
        for path, nested in _nested_models(model, section):
            parts += [f"## `{path}` {{#{_key_id(path)}}}", "", text(inspect.getdoc(nested) or ""), "",
                      _model_keys(nested, path, config)]
    return "\n".join(parts)


def _key_id(path: str, key: str = "") -> str:
    return "-".join(p for p in (path.replace(".", "-").replace("[]", ""), key) if p)


def _model_keys(model, path: str, config) -> str:
    """Each key as a heading of its own (so a page can link to it), its facts on one line, then what it is."""
    defaults = _defaults(model)
    types = {name: _type_name(field.annotation) for name, field in model.model_fields.items()}
    if path == "build":  # build.flavor as kit.yaml reads it (requested_flavor): the hosts decide auto and tf
        defaults["flavor"] = _value(config.requested_flavor(config.ConfigFile())[0])
        types["flavor"] = _type_name(typing.Literal[(*config.AUTO_FLAVORS, *config.FLAVORS)])
    comments = _field_comments(model)
    flags = _flags_of_every_command()
    parts = []
    for name, field in model.model_fields.items():
        hint = config.HINTS.get(name) if path in config.SECTIONS else None
        facts = [f"**type** {text(types[name])}", f"**default** {defaults.get(name, 'required')}"]
        if flag := _flag_cell(config, name, flags):
            facts.append(f"**flag** {flag}")
        what = [text(w) for w in (comments.get(name, ""), field.description or "") if w]
        if hint:
            what.append(f"**Expected:** {text(hint)}")
        parts += [f"### `{name}` {{#{_key_id(path, name)}}}", "", " · ".join(facts), ""]
        parts += [" ".join(what), ""] if what else []
    return "\n".join(parts)


def _defaults(model) -> dict[str, str]:
    """Each field's default as kit fills it in: the model made with no value, and, where the model has a flavor,
    made once for each flavor (a default the flavor changes is shown per flavor)."""
    made = {}
    choices = _literal_choices(model.model_fields["flavor"].annotation) if "flavor" in model.model_fields else []
    for choice in [None, *choices]:
        try:
            made[choice] = model() if choice is None else model(flavor=choice)
        except Exception:  # noqa: BLE001 - a flavor that needs more than its name: its defaults are not shown
            continue
    out = {}
    for name, field in model.model_fields.items():
        per = {c: _value(getattr(m, name)) for c, m in made.items() if c is not None and name != "flavor"}
        if None in made and (len(set(per.values())) <= 1):
            out[name] = _value(getattr(made[None], name))
        elif per and len(set(per.values())) == 1:
            out[name] = next(iter(per.values()))
        elif per:
            out[name] = "by flavor: " + ", ".join(f"{c} {v}" for c, v in per.items())
        elif not field.is_required():
            out[name] = _value(field.get_default(call_default_factory=True))
    return out


def _value(v: Any) -> str:
    if v is None:
        return "not set"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, enum.Enum):
        v = v.value
    if isinstance(v, (tuple, list)):
        return "`[" + ", ".join(str(_plain_value(x)) for x in v) + "]`"
    return code(str(_plain_value(v)))


def _plain_value(v: Any) -> Any:
    return v.value if isinstance(v, enum.Enum) else v


def _literal_choices(annotation) -> list:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [c for arg in typing.get_args(annotation) for c in _literal_choices(arg)]


def _type_name(annotation) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of: " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names)
    if origin in (tuple, list, set, frozenset):
        items = [a for a in args if a is not Ellipsis]
        return f"list of {_type_name(items[0])}" if items else "list"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}" if args else "mapping"
    names = {str: "string", int: "whole number", float: "number", bool: "true or false", Path: "path"}
    if annotation in names:
        return names[annotation]
    if _is_model(annotation):
        return f"mapping ({annotation.__name__})"
    return getattr(annotation, "__name__", str(annotation))


def _is_model(t) -> bool:
    return inspect.isclass(t) and hasattr(t, "model_fields")


def _nested_models(model, path: str) -> Iterator[tuple[str, Any]]:
    """Models used as the type of a field (or of a list's items): `cluster.mounts[]` and its own keys."""
    for name, field in model.model_fields.items():
        for t in _types_in(field.annotation):
            if _is_model(t):
                many = typing.get_origin(field.annotation) in (tuple, list) or any(
                    typing.get_origin(a) in (tuple, list) for a in typing.get_args(field.annotation))
                sub = f"{path}.{name}" + ("[]" if many else "")
                yield sub, t
                yield from _nested_models(t, sub)


def _types_in(annotation) -> Iterator[Any]:
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _types_in(arg)


def _field_comments(model) -> dict[str, str]:
    """The `# comment` beside each field in the model's source: what kit's authors say the field is for."""
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    body = ast.parse(source).body[0].body
    # "None: --ipc=host" says what an unset value means: in the reference that is "not set"
    return {stmt.target.id: re.sub(r"^None\b", "not set", comments[stmt.lineno]) for stmt in body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.lineno in comments}


def _flag_cell(config, name: str, flags: dict[str, list[str]]) -> str:
    flag = config.flag_name(name) if hasattr(config, "flag_name") else "--" + name.replace("_", "-")
    where = flags.get(flag, [])
    if not where:
        return ""
    shown = ", ".join(f"[{c}](commands.md#{_anchor(c)})" for c in where[:3])
    return f"`{flag}` ({shown}{f' and {len(where) - 3} more' if len(where) > 3 else ''})"


# ---------------------------------------------------------------- commands

def kit_commands() -> list[tuple[list[str], Any, Any]]:
    """(["kit", "bench", "net"], click command, its context) for kit and every command under it, in the order
    `--help` lists them; hidden ones left out."""
    import importlib

    import typer

    importlib.import_module("kit.app")  # importing it adds every command to the app
    from kit.cli.common import app

    root = typer.main.get_command(app)
    found = []

    def walk(cmd, path, parent):
        ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent)
        found.append((path, cmd, ctx))
        for sub in cmd.list_commands(ctx) if hasattr(cmd, "list_commands") else []:
            child = cmd.get_command(ctx, sub)
            if child is not None and not getattr(child, "hidden", False):
                walk(child, [*path, sub], ctx)

    walk(root, ["kit"], None)
    return found


def _anchor(command_path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", command_path.lower()).strip("-")


def params(cmd, ctx) -> list[tuple[str, str, str]]:
    """(kind, what --help shows in its first column, its help) of every parameter, --help included."""
    out = []
    for p in cmd.get_params(ctx):
        if getattr(p, "hidden", False):
            continue
        record = p.get_help_record(ctx)
        kind = getattr(p, "param_type_name", "option")
        if record is None:  # a plain click argument: no help record
            record = (p.human_readable_name, getattr(p, "help", "") or "")
        out.append((kind, record[0], record[1]))
    return out


def _flags_of_every_command() -> dict[str, list[str]]:
    """flag -> the commands that take it ("kit up")."""
    found: dict[str, list[str]] = {}
    for path, cmd, ctx in kit_commands():
        for p in cmd.get_params(ctx):
            if getattr(p, "param_type_name", "") == "option" and not getattr(p, "hidden", False):
                for flag in [*p.opts, *p.secondary_opts]:
                    found.setdefault(flag, []).append(" ".join(path))
    return found


def commands_reference() -> str:
    everything = kit_commands()
    parts = ["## Commands at a glance", "",
             table(["command", "what it does"],
                   [[f"[`{' '.join(path)}`](#{_anchor(' '.join(path))})", text(_summary(cmd))]
                    for path, cmd, _ in everything[1:]]), ""]
    for path, cmd, ctx in everything:
        name = " ".join(path)
        usage = " ".join([name, *cmd.collect_usage_pieces(ctx)])
        parts += [f"## {name} {{#{_anchor(name)}}}", "", "```text", usage, "```", "",
                  *[text(p) + "\n" for p in _paragraphs(cmd.help or "")]]
        subs = [(p, c) for p, c, _ in everything if len(p) == len(path) + 1 and p[:-1] == path]
        if subs:
            parts += ["Commands: " + ", ".join(f"[`{' '.join(p)}`](#{_anchor(' '.join(p))})" for p, _ in subs), ""]
        found = params(cmd, ctx)
        for kind, title in (("argument", "argument"), ("option", "option")):
            rows = [[code(first), text(help_)] for k, first, help_ in found if (k == "argument") == (kind == "argument")]
            if rows:
                parts += [table([title, "what it does"], rows), ""]
    return "\n".join(parts)


def _summary(cmd) -> str:
    return cmd.short_help or next(iter(_paragraphs(cmd.help or "")), "")


def _paragraphs(help_: str) -> list[str]:
    """A command's help (its docstring) as paragraphs; click's \\b (keep these lines as they are) is dropped."""
    return [p.replace("\b\n", "").strip() for p in re.split(r"\n\s*\n", inspect.cleandoc(help_)) if p.strip()]


# ---------------------------------------------------------------- kit doctor's checks

LEVELS = ("ok", "warn", "fail")


def doctor_checks(root: Path | None = None) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """check name -> level -> [(what it says, its fix)], from every `Finding(host, CHECK, LEVEL, TEXT, FIX)` in
    kit's source, in the order of the source. Values that are worked out when the check runs are shown as `…`; a
    check name or text passed in by the caller of a helper (`_disk(host, "docker disk", ...)`) is taken from each
    call of that helper, and a name given a string in its function or at the top of a module is that string."""
    import kit

    root = root or Path(kit.__file__).parent
    trees = [ast.parse(path.read_text()) for path in sorted(root.rglob("*.py"))]
    constants = {name: value for tree in trees for name, value in _assigned(tree.body).items()}
    functions = {f.name: f for tree in trees for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    found: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for tree in trees:
        for func, call in _finding_calls(tree):
            names = {**constants, **(_assigned(ast.walk(func)) if func else {})}
            for said, helper in _spelled_out(call, func, functions):
                for bound in _bindings(tree, func, said):
                    _add_finding(found, said, Names(bound, {**names, **helper}), func)
    return found


def _spelled_out(call: ast.Call, func, functions) -> list[tuple[ast.Call, dict[str, list[ast.expr]]]]:
    """The Finding call as written; or, where its text and fix are a helper's answer (`Finding(host, CHECK, FAIL,
    *found)` with `found = helper(...)`), one call for each (text, fix) the helper returns, with the helper's own
    names."""
    starred = next((a for a in call.args if isinstance(a, ast.Starred)), None)
    if starred is None or func is None or not isinstance(starred.value, ast.Name):
        return [(call, {})]
    given = [v for v in _assigned(ast.walk(func)).get(starred.value.id, []) if isinstance(v, ast.Call)]
    helper = functions.get(_called(given[0])) if given else None
    if helper is None:
        return [(call, {})]
    before = call.args[:call.args.index(starred)]
    answers = [r.value.elts for r in ast.walk(helper) if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)]
    return [(ast.Call(func=call.func, args=[*before, *elts], keywords=call.keywords), _assigned(ast.walk(helper)))
            for elts in answers]


class Names:
    """What a name in a Finding's arguments stands for: a value the helper was called with, else the strings
    assigned to it in its function or at the top of a module."""

    def __init__(self, bound: dict[str, ast.expr], assigned: dict[str, list[ast.expr]]) -> None:
        self.bound, self.assigned, self.seen = bound, assigned, set()


def _assigned(statements) -> dict[str, list[ast.expr]]:
    """name -> the expressions assigned to it (`a = x`, `a, b = x, y`)."""
    out: dict[str, list[ast.expr]] = {}
    for stmt in statements:
        if not isinstance(stmt, ast.Assign):
            continue
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                out.setdefault(target.id, []).append(stmt.value)
            elif isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and \
                    len(target.elts) == len(stmt.value.elts):
                for t, v in zip(target.elts, stmt.value.elts):
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, []).append(v)
    return out


def _finding_calls(tree: ast.AST) -> list[tuple[ast.FunctionDef | None, ast.Call]]:
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called(node) == "Finding":
            func = node
            while func in parents and not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func = parents[func]
            found.append((func if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else None, node))
    return sorted(found, key=lambda f: (f[1].lineno, f[1].col_offset))


def _called(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _arg(call: ast.Call, i: int, name: str) -> ast.expr | None:
    if i < len(call.args):
        return call.args[i]
    return next((k.value for k in call.keywords if k.arg == name), None)


def _bindings(tree: ast.AST, func, call: ast.Call) -> list[dict[str, ast.expr]]:
    """The values a helper's parameters take at each of its calls, where the Finding's check name is one of them
    (else one empty binding: the Finding says all it says by itself)."""
    check = _arg(call, 1, "check")
    if func is None or not isinstance(check, ast.Name):
        return [{}]
    names = [a.arg for a in func.args.args]
    if check.id not in names:
        return [{}]
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call) and _called(n) == func.name),
                   key=lambda n: n.lineno)
    return [{n: _arg(c, i, n) for i, n in enumerate(names) if _arg(c, i, n) is not None} for c in calls] or [{}]


def _add_finding(found, call: ast.Call, names: Names, func) -> None:
    check = _render(_arg(call, 1, "check"), names)
    if not check or "…" in check:
        return
    for level in _levels(_arg(call, 2, "level"), func):
        prefer = min if level == "ok" else max  # ("" if fine else ": too small"): the ok line says less
        said = _render(_arg(call, 3, "text"), names, prefer)
        fix = "" if level == "ok" else _render(_arg(call, 4, "fix"), names)
        if not re.search(r"[A-Za-z]", said):
            continue  # all of it worked out at run time (another step's message): nothing to show
        if (said, fix) not in found.setdefault(check, {}).setdefault(level, []):
            found[check][level].append((said, fix))


def _levels(node: ast.expr | None, func) -> list[str]:
    """OK/WARN/FAIL by name, or every one of them a variable may be given in its function."""
    names = _level_names(node)
    if not names and isinstance(node, ast.Name) and func is not None:
        for value in _assigned(ast.walk(func)).get(node.id, []):
            names |= _level_names(value)
    return [lv for lv in LEVELS if lv in names] or ["fail"]


def _level_names(node: ast.expr | None) -> set[str]:
    if node is None:
        return set()
    return {n.id.lower() for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in ("OK", "WARN", "FAIL")} | \
        {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in LEVELS}


def _render(node: ast.expr | None, names: Names, prefer=max) -> str:
    """An expression's text: strings as written, what is known only when the check runs as `…`."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        return str(node.value) if isinstance(node.value, str) else "…"
    if isinstance(node, ast.Name):
        return _render_name(node.id, names, prefer)
    if isinstance(node, ast.JoinedStr):
        return "".join(_render(v.value if isinstance(v, ast.FormattedValue) else v, names, prefer)
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _render(node.left, names, prefer) + _render(node.right, names, prefer)
    if isinstance(node, ast.IfExp):  # ("" if fine else ": too small"): by prefer; a problem's (special if x else
        body, orelse = _render(node.body, names, prefer), _render(node.orelse, names, prefer)  # usual): the usual
        return orelse if body and orelse and prefer is max else prefer((body, orelse), key=len)
    return "…"


def _render_name(name: str, names: Names, prefer) -> str:
    if name in names.bound:
        return _render(names.bound[name], Names({}, names.assigned), prefer)
    values = [v for v in names.assigned.get(name, []) if _is_text(v)]
    if not values or name in names.seen:
        return "…"
    names.seen.add(name)
    try:
        return prefer((_render(v, names, prefer) for v in values), key=len)
    finally:
        names.seen.discard(name)


def _is_text(node: ast.expr) -> bool:
    """A string, or an expression made of strings: not a number, a call or an attribute."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.BinOp):
        return _is_text(node.left) or _is_text(node.right)
    if isinstance(node, ast.IfExp):
        return _is_text(node.body) or _is_text(node.orelse)
    return isinstance(node, ast.JoinedStr)


def doctor_reference() -> str:
    checks = doctor_checks()
    parts = []
    for check, levels in checks.items():
        parts += [f"### {check} {{#check-{_anchor(check)}}}", ""]
        ok = levels.get("ok", [])
        if ok:
            parts += ["When all is well: " + "; or ".join(f"“{text(s)}”" for s, _ in ok) + ".", ""]
        rows = [[level, text(said), text(fix)] for level in ("fail", "warn") for said, fix in levels.get(level, [])]
        if rows:
            parts += [table(["level", "what it says (… is filled in from the host)", "the fix it gives"], rows), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------- what a job may not set

def reserved_env_reference() -> str:
    """The names `kit run -e` and `--env-file` refuse, and why (kit.jobs.env)."""
    from kit.jobs import env as jobenv

    rows = [[code(name), text(why)] for name, why in jobenv.RESERVED.items()]
    rows.append([code(jobenv.LAUNCHER_SET.pattern), "the launcher sets it for each rank (names that match this "
                 "regular expression)"])
    rows.append([code(jobenv.AT_START.pattern), "it acts when a rank's interpreter starts, before the job's "
                 "variables are read (names that match this regular expression)"])
    return table(["name", "why kit refuses it"], rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "kit.yaml": config_reference,
    "commands": commands_reference,
    "doctor-checks": doctor_reference,
    "reserved-env": reserved_env_reference,
}
