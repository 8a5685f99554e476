"""A rank that writes without ever ending its line: rank 0 writes MB megabytes to stdout with no newline and exits
with 3; every other rank prints one short line and ends.

  endless_line.py MB
"""

import os
import sys

if os.environ.get("HOROVOD_RANK", "0") == "0":
    block = b"x" * (1 << 20)
    for _ in range(int(sys.argv[1])):
        sys.stdout.buffer.write(block)
        sys.stdout.buffer.flush()
    sys.exit(3)
print(f"rank {os.environ['HOROVOD_RANK']} wrote a short line", flush=True)
