"""kit's command line: the commands of kit.cli's modules, on one Typer app."""

from kit.cli import build, cluster, demo, jobs
from kit.cli.common import app

COMMANDS = (build, cluster, demo, jobs)  # importing them adds their commands to the app


def main() -> None:
    app()
