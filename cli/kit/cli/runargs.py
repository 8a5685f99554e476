"""`kit run [OPTIONS] SCRIPT [ARGS]...`: which arguments are kit's and which the script's, as torchrun and horovodrun
take a script's arguments: as they come, with no `--` needed.

Before the script: kit run's options only (an unknown one is refused: it is most likely the script's, put before
it). After the script: kit run's own options wherever they stand, except SCRIPTS_OWN, and every other argument is
the script's, in order. After `--`: all of it is the script's, verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typer.core import TyperCommand

from kit.cli.common import _report
from kit.errors import BadInput, KitError

# After the script these are the script's: training scripts have options of these names (a config file, a run's name,
# a work folder, a data folder as -d, their own help). Before the script they are kit's (--detach is kit's anywhere).
SCRIPTS_OWN = ("--config", "-c", "--name", "--workdir", "-d", "--help")


@dataclass(frozen=True)
class Split:
    kit: list[str] = field(default_factory=list)    # kit's options and their values, in their order
    script: str | None = None
    args: list[str] = field(default_factory=list)   # the script's arguments, in their order

    def argv(self) -> list[str]:
        """The same for click: kit's options, then `--` and the script with its arguments (all positional)."""
        return [*self.kit, "--", self.script, *self.args] if self.script is not None else list(self.kit)


def options_of(params) -> dict[str, bool]:
    """Every spelling of a click command's options -> whether it takes a value."""
    found = {}
    for p in params:
        if p.param_type_name == "option":
            flag = bool(getattr(p, "is_flag", False) or getattr(p, "count", False))
            found.update({spelling: not flag for spelling in [*p.opts, *p.secondary_opts]})
    return found


def split(argv: list[str], options: dict[str, bool], command: str = "kit run") -> Split:
    """kit run's (or kit export --to slurm's) arguments -> (kit's options, the script, the script's arguments).
    options: options_of()."""
    kit: list[str] = []
    script: str | None = None
    args: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # the rest is the script's (the first of it the script itself, if none came yet)
            rest = argv[i + 1:]
            return Split(kit, script, args + rest) if script is not None else \
                Split(kit, rest[0] if rest else None, rest[1:])
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        if arg.startswith("-") and arg != "-" and name in options and not (script is not None and name in SCRIPTS_OWN):
            take = 2 if options[name] and "=" not in arg else 1
            kit += argv[i:i + take]
            i += take
            continue
        if script is None and arg[:1] == "-" and arg != "-":
            if arg[:2] in options and options[arg[:2]] and not arg.startswith("--"):  # -eNAME=VALUE
                kit.append(arg)
                i += 1
                continue
            raise _unknown(arg, argv[i + 1:], command)
        if script is None:
            script = arg
        else:
            args.append(arg)
        i += 1
    return Split(kit, script, args)


def _unknown(arg: str, after: list[str], command: str) -> BadInput:
    script = next((a for a in after if a.endswith(".py")), "SCRIPT")
    return BadInput(f"{arg} is not an option of {command}; before the script, only kit's options go",
                    hint=f"put the script's arguments after it: {command} [OPTIONS] {script} {arg} ...")


class RunCommand(TyperCommand):
    """kit run (and kit export, whose --to slurm takes a script as kit run does), whose arguments split() sorts out
    before click reads them."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:  # (shell completion reads a line as it is)
            try:
                args = split(args, options_of(self.get_params(ctx)), f"kit {ctx.info_name}").argv()
            except KitError as e:
                _report(e)
        return super().parse_args(ctx, args)
