"""`kit cp`'s arguments: which side is on a host (HOST:PATH) and which here, and where a copy lands, by docker
cp's rules. Pure but for looking at this machine's paths; bad input is found before a host is contacted."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path

from kit.cluster import state as st
from kit.errors import BadInput
from kit.data.untar import Target


@dataclass(frozen=True)
class Remote:
    host: st.HostState
    path: str         # absolute, normalized, inside the workspace
    given: str        # as typed, for messages: HOST:PATH
    contents: bool    # PATH ended with /. : what the folder holds, not the folder


@dataclass(frozen=True)
class Local:
    path: Path
    given: str        # as typed: a trailing / or /. is meant
    contents: bool


def split(arg: str, hosts: list[st.HostState]) -> tuple[st.HostState, str] | None:
    """(host, path) of HOST:PATH, or None for a local path; a host kit does not know is bad input. A local path with a
    colon in its first part is written ./NAME, as for docker cp."""
    head, colon, path = arg.partition(":")
    if not colon or "/" in head or not head:
        return None
    found = next((h for h in hosts if head in (h.name, h.address)), None)
    if found is None:
        raise BadInput(f"{arg}: {head} is not a host of the cluster",
                       hint=f"use one of: {', '.join(h.name for h in hosts)} (HOST:PATH); a local path with a colon "
                            f"is written ./{arg}")
    return found, path


def remote_path(arg: str, path: str, workspace: str) -> str:
    """The absolute path of PATH (relative to the workspace, or absolute inside it), normalized; outside it is bad
    input."""
    full = posixpath.normpath(posixpath.join(workspace, path)) if path else workspace
    full = "/" + full.lstrip("/")  # normpath keeps a leading //
    if full != workspace and not full.startswith(workspace.rstrip("/") + "/"):
        raise BadInput(f"{arg}: {full} is outside the cluster's workspace {workspace}",
                       hint=f"give a path relative to the workspace (HOST:checkpoints/model.pt) or inside "
                            f"{workspace}")
    return full


def contents_of(path: str) -> bool:
    """docker cp's SRC/. : the folder's contents."""
    return path == "." or path.endswith("/.")


def endpoints(src: str, dest: str, hosts: list[st.HostState], workspace: str) -> tuple[Remote | Local, Remote | Local]:
    """(source, destination): one of them on a host (HOST:PATH), the other here."""
    ends: list[Remote | Local] = []
    for arg in (src, dest):
        found = split(arg, hosts)
        ends.append(Local(Path(arg), arg, contents_of(arg)) if found is None else
                    Remote(found[0], remote_path(arg, found[1], workspace), arg, contents_of(found[1])))
    if type(ends[0]) is type(ends[1]):
        raise BadInput(f"kit cp {src} {dest}: one of them must be on a host of the cluster, the other here",
                       hint="write the host's side as HOST:PATH, e.g. kit cp h1:checkpoints/model.pt . or "
                            "kit cp data.csv h1:")
    return ends[0], ends[1]


def local_target(dest: Local, source_name: str, contents: bool) -> Target:
    """docker cp's rules: into an existing folder under the source's name; else as dest, in a folder that exists."""
    path = dest.path
    if path.is_dir():
        return Target(path, "" if contents else source_name)
    if contents and path.exists():
        raise BadInput(f"{dest.given} is a file: a folder's contents go into a folder", hint="give a folder")
    if dest.given.endswith("/"):
        raise BadInput(f"{dest.given}: no such folder", hint="make it first, or drop the trailing / to copy under "
                                                               "that name")
    if not path.parent.is_dir():
        raise BadInput(f"{dest.given}: the folder {path.parent} does not exist",
                       hint=f"make it first (mkdir -p {shlex.quote(str(path.parent))})")
    return Target(path.parent, path.name, onto_file=path.exists())


def source_name(source: Remote) -> str:
    """The name a copy of source takes in a folder."""
    return posixpath.basename(source.path) or "workspace"


def remote_target(kind: str, dest: Remote, source: Local) -> tuple[str, str]:
    """(the host's folder the copy goes into, its name there; "": the source's contents), by docker cp's rules."""
    if kind == "folder":
        return dest.path, "" if source.contents else source.path.resolve().name
    if kind == "noparent" or dest.given.endswith("/"):
        raise BadInput(f"{dest.given}: the folder {posixpath.dirname(dest.path) if kind == 'noparent' else dest.path} "
                       f"does not exist on {dest.host.name}", hint="copy into a folder that exists (kit cp makes none)")
    if kind == "file" and source.path.is_dir():
        raise BadInput(f"{dest.given} is a file: a folder cannot be copied onto it", hint="give a folder or a new name")
    return posixpath.dirname(dest.path), posixpath.basename(dest.path)


def local_source(source: Local) -> None:
    if not source.path.exists() and not source.path.is_symlink():
        raise BadInput(f"{source.given}: no such file or folder", hint="give a file or folder of this machine")
    if source.contents and not source.path.is_dir():
        raise BadInput(f"{source.given} is not a folder: /. takes a folder's contents", hint="drop the /.")
