"""kit's command line: the commands of kit.cli's modules, on one Typer app."""

from kit.cli import bench, build, cluster, data, demo, doctor, export, joblist, joblogs, jobs, push
from kit.cli.common import app

# importing them adds their commands to the app
COMMANDS = (bench, build, cluster, data, demo, doctor, export, joblist, joblogs, jobs, push)


def main() -> None:
    app(prog_name="kit")  # also as `python -m kit`: shell completion is kit's (_KIT_COMPLETE)
