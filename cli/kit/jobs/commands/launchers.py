"""The launchers a job can have (horovod, torchrun, tf), what each image can run, and TF's worker config. The
commands each host runs for torchrun and tf, and the script that starts them over the cluster SSH, are in
kit.backends.cluster.supervisor: they are launched again from there when a job restarts.

Their output is made to look like horovodrun's (`[RANK]<stdout>:text`, each rank's `@@kit-exit` line
from the rank launcher), so streaming, logs, failure naming and Ctrl-C are the Horovod launch's.
"""

from __future__ import annotations

import json

from kit.errors import BadInput

LAUNCHERS = ("horovod", "torchrun", "tf")
# What each image framework can run: torch + Horovod images horovodrun and torchrun; TensorFlow images tf.
FRAMEWORK_LAUNCHERS = {"horovod": ("horovod", "torchrun"), "tensorflow": ("tf",)}


def check_launcher(launcher: str) -> str:
    if launcher not in LAUNCHERS:
        raise BadInput(f"--launcher: '{launcher}' is not a launcher", hint=f"use one of: {', '.join(LAUNCHERS)}")
    return launcher


def tf_config(workers: list[str], index: int) -> str:
    """TF_CONFIG of worker `index`: every worker's address:port, in inventory order."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}},
                      separators=(",", ":"))
