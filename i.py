import sys, shlex; sys.path.insert(0, "/work/main/cli")
from kit import jobs
print(shlex.split(jobs.interrupt_command("c", sys.argv[1]))[-1])
