"""`kit run [OPTIONS] SCRIPT [ARGS]...`: which arguments are kit's and which the script's, as torchrun and horovodrun
take a script's arguments: as they come, with no `--` needed.

Before the script: kit run's options only (an unknown one is refused: it is most likely the script's, put before
it). After the script: kit run's own options wherever they stand, except SCRIPTS_OWN, and every other argument is
the script's, in order. After `--`: all of it is the script's, verbatim.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import typer
from typer.core import TyperCommand

from kit.cli.common import BAD_INPUT_HINT, _report
from kit.errors import BadInput, KitError

# After the script these are the script's: training scripts have options of these names (a config file, a run's name,
# a work folder, a data folder as -d, a count as -n, their own help). Before the script they are kit's (--detach is
# kit's anywhere).
SCRIPTS_OWN = ("--config", "-c", "--name", "--workdir", "-d", "-n", "--help")


@dataclass(frozen=True)
class Split:
    kit: list[str] = field(default_factory=list)    # kit's options and their values, in their order
    script: str | None = None
    args: list[str] = field(default_factory=list)   # the script's arguments, in their order
    after: list[str] = field(default_factory=list)  # kit's options given after the script (as spelled there)
    tail: list[str] = field(default_factory=list)   # everything after the script, as given (but a `--`)

    def argv(self) -> list[str]:
        """The same for click: kit's options, then `--` and the script with its arguments (all positional)."""
        return [*self.kit, "--", self.script, *self.args] if self.script is not None else list(self.kit)


SPLIT = "kit.split"  # ctx.meta's key for how RunCommand split the command line


def options_of(params) -> dict[str, bool]:
    """Every spelling of a click command's options -> whether it takes a value."""
    found = {}
    for p in params:
        if p.param_type_name == "option":
            flag = bool(getattr(p, "is_flag", False) or getattr(p, "count", False))
            found.update({spelling: not flag for spelling in [*p.opts, *p.secondary_opts]})
    return found


def split(argv: list[str], options: dict[str, bool], command: str = "kit run",
          foreign: dict[str, str] | None = None) -> Split:
    """kit run's (or kit export --to slurm's) arguments -> (kit's options, the script, the script's arguments).
    options: options_of(); foreign: options of another command (kit run's -H, for kit export) -> why they are not
    this one's, refused after the script unless they follow `--`."""
    kit: list[str] = []
    script: str | None = None
    args: list[str] = []
    after: list[str] = []
    start = len(argv)  # where the script's tail begins
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # the rest is the script's (the first of it the script itself, if none came yet)
            rest = argv[i + 1:]
            tail = [a for a in argv[start:] if a != "--"]
            return Split(kit, script, args + rest, after, tail) if script is not None else \
                Split(kit, rest[0] if rest else None, rest[1:], after, rest[1:])
        # --name=VALUE, and -np=4 as horovodrun takes it (not -eNAME=VALUE: a short option's value follows it)
        name = arg.split("=", 1)[0] if arg.startswith("--") or re.fullmatch(r"-[A-Za-z]{2,}=.*", arg) else arg
        if arg.startswith("-") and arg != "-" and name in options and not (script is not None and name in SCRIPTS_OWN):
            take = 2 if options[name] and "=" not in arg else 1
            if i + take > len(argv):
                raise BadInput(f"{arg} needs a value", hint=f"give it one: {arg} VALUE (`{command} --help` says "
                               "which)" + (f"; or, {dashdash(command, script, argv[start:], name)}" if script else ""))
            kit += argv[i:i + take]
            if script is not None:
                after.append(name)
            i += take
            continue
        if script is not None and foreign and name in foreign:
            tail = [a for a in argv[start:] if a != "--"]
            raise BadInput(f"{arg}: {foreign[name]}", hint=dashdash(command, script, tail, name))
        if script is None and arg[:1] == "-" and arg != "-":
            if arg[:2] in options and options[arg[:2]] and not arg.startswith("--"):  # -eNAME=VALUE
                kit.append(arg)
                i += 1
                continue
            raise _unknown(arg, argv[i + 1:], command)
        if script is None:
            script, start = arg, i + 1
        else:
            args.append(arg)
        i += 1
    return Split(kit, script, args, after, argv[start:])


def dashdash(command: str, script: str, tail: list[str], option: str) -> str:
    """The fix for an option of kit's that may be the script's: the script's arguments after `--`."""
    return (f"if {option} is the script's, give the script's arguments after --: {command} [OPTIONS] {script} -- "
            f"{shlex.join(tail)}")


def _unknown(arg: str, after: list[str], command: str) -> BadInput:
    script = next((a for a in after if a.endswith(".py")), "SCRIPT")
    return BadInput(f"{arg} is not an option of {command}; before the script, only kit's options go",
                    hint=f"put the script's arguments after it: {command} [OPTIONS] {script} {arg} ...")


class RunCommand(TyperCommand):
    """kit run (and kit export, whose --to slurm takes a script as kit run does), whose arguments split() sorts out
    before click reads them."""

    foreign: dict[str, str] | None = None  # another command's options, refused after the script (split's)

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if ctx.resilient_parsing:  # (shell completion reads a line as it is)
            return super().parse_args(ctx, args)
        command = f"kit {ctx.info_name}"
        try:
            found = split(args, options_of(self.get_params(ctx)), command, self.foreign)
        except KitError as e:
            _report(e)
        ctx.meta[SPLIT] = found
        try:
            return super().parse_args(ctx, found.argv())
        except typer.BadParameter as e:
            if e.param is None or not set(e.param.opts + e.param.secondary_opts) & set(found.after):
                raise
            token = BAD_INPUT_HINT.set(lambda error: self._dashdash(ctx, command, found, error))
            try:
                _report(BadInput(f"{'/'.join(e.param.opts)}: {e.message}",
                                 hint=f"`{command} --help` says what it takes"))
            finally:
                BAD_INPUT_HINT.reset(token)

    def invoke(self, ctx):
        found = ctx.meta.get(SPLIT)
        if found is None or not found.after:
            return super().invoke(ctx)
        # an error about an option of kit's given after the script says how to give it to the script instead
        token = BAD_INPUT_HINT.set(lambda e: self._dashdash(ctx, f"kit {ctx.info_name}", found, e))
        try:
            return super().invoke(ctx)
        finally:
            BAD_INPUT_HINT.reset(token)

    def _dashdash(self, ctx, command: str, found: Split, e: BadInput) -> str | None:
        """The `--` fix, where e names an option of kit's that was given after the script."""
        for option in found.after:
            spellings = next((p.opts + p.secondary_opts for p in self.get_params(ctx)
                              if option in p.opts + p.secondary_opts), [option])
            if any(re.match(rf"{re.escape(s)}\b(?!-)", e.message) for s in spellings):
                return dashdash(command, found.script or "SCRIPT", found.tail, option)
        return None
