"""A folder on a host that kit writes the user's files into (a Slurm job's folder, a venv export): safe only where
it and every folder above it are the user's or root's, and not writable by others unless sticky (/tmp). Anyone else
who may rename entries in one could swap kit's folder for a link between a check and a write, and read or replace
what kit puts there. The check is a shell function run on that host, with its own stat, on the path with its links
resolved; `unsafe` reads what it printed."""

from __future__ import annotations

MARK = "@@kit-unsafe"

# check PATH: PATH and each folder above it, up to /. Prints `@@kit-unsafe WHY OWNER MODE PATH` and exits 3 where
# one is not safe; `me` is the user kit runs as there.
CHECK_SH = r"""
me=$(id -u)
check() {
  p=$1
  while :; do
    if [ -e "$p" ]; then
      set -- $(stat -L -c '%u %a' -- "$p") || exit 1
      mode=$((0$2))
      if [ "$1" != 0 ] && [ "$1" != "$me" ]; then echo "@@kit-unsafe owner $1 $2 $p"; exit 3; fi
      if [ $((mode & 18)) -ne 0 ] && [ $((mode & 512)) -eq 0 ]; then echo "@@kit-unsafe mode $1 $2 $p"; exit 3; fi
    fi
    [ "$p" = / ] && return 0
    p=$(dirname -- "$p")
  done
}
"""

_WHY = {"owner": "owned by uid {owner}, not you", "mode": "mode {mode}: others may rename what is in it",
        "moved": "no longer where it was a moment ago: another user's folder or link took its place",
        "notkit": "not empty and holds no export of kit's: kit replaces no folder it did not write",
        "notdir": "not a folder"}


def unsafe(stdout: str) -> tuple[str, str] | None:
    """(the folder, what is wrong with it) where the check printed its mark; None where it did not."""
    if MARK not in stdout:
        return None
    why, owner, mode, where = (stdout.split(MARK, 1)[1].split(None, 3) + ["-"] * 4)[:4]
    return where.strip().splitlines()[0] if where.strip() else "-", \
        _WHY.get(why, why).format(owner=owner, mode=mode)
