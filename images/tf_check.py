"""kit's image check for the TensorFlow flavors: N workers of a MultiWorkerMirroredStrategy on this machine;
every worker contributes its index+1 and the all-reduced sum must be n(n+1)/2.

`python /opt/kit/tf_check.py N` starts the N workers (each with its TF_CONFIG, on free loopback ports) and
exits non-zero unless every one of them printed the right sum, in the line `kit` parses (as allreduce_check.py).
"""

import json
import os
import socket
import subprocess
import sys


def worker() -> int:
    import tensorflow as tf

    task = json.loads(os.environ["TF_CONFIG"])
    rank, size = task["task"]["index"], len(task["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def allreduce():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.constant(float(rank + 1))))
    total = float(strategy.experimental_local_results(allreduce())[0])
    expected = size * (size + 1) / 2
    ok = total == expected and strategy.num_replicas_in_sync == size
    print(f"kit-allreduce rank={rank} size={strategy.num_replicas_in_sync} sum={total:g} expected={expected:g} "
          f"{'ok' if ok else 'WRONG'}", flush=True)
    return 0 if ok else 1


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def main(size: int) -> int:
    workers = [f"127.0.0.1:{p}" for p in free_ports(size)]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker"], env={
        **os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})})
        for i in range(size)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=150))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("kit-tf-check: the workers did not finish in 150 s", flush=True)
            return 1
    return max(codes)


if __name__ == "__main__":
    sys.exit(worker() if sys.argv[1:] == ["--worker"] else main(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
