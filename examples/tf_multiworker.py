"""An MNIST CNN in Keras with TensorFlow's MultiWorkerMirroredStrategy, as the multi-worker Keras guide does it.

Every worker runs this script with TF_CONFIG set (its own index in a list of every worker's address):

    kit run --launcher tf examples/tf_multiworker.py -- --epochs 3

The model is built and compiled under strategy.scope(); model.fit gets a dataset of global batches that
tf.data shards per worker (each worker reads every N-th sample), and the strategy all-reduces the gradients.
Reads the MNIST idx files (train-images-idx3-ubyte, train-labels-idx1-ubyte, optionally .gz) from --data when
they are there; otherwise it generates 28x28 digits-like data (a fixed pattern per class plus noise). Worker 0,
the chief, prints the loss and accuracy per epoch and saves the model; the others save to a scratch folder that
they delete (saving is a collective step: every worker takes part).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import struct
import tempfile
from pathlib import Path

import numpy as np

# Keras 3 does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585); TensorFlow's own multi-worker
# guide uses Keras 2 (the tf-keras package) as tf.keras. kit's tf images set this too.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402  (after the Keras choice)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/mnist", help="folder of the MNIST idx files")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per worker; the global batch is this times the workers")
    p.add_argument("--lr", type=float, default=0.01, help="for one worker; scaled by the number of workers")
    p.add_argument("--samples", type=int, default=6000, help="training images to use (0: all)")
    p.add_argument("--checkpoint", default="checkpoints/mnist_tf.keras")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def read_idx(path: Path) -> np.ndarray:
    """An idx file (MNIST's format): magic, dimensions, then unsigned bytes."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        _, _, kind, dims = struct.unpack(">BBBB", f.read(4))
        shape = struct.unpack(">" + "I" * dims, f.read(4 * dims))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(shape)


def mnist(folder: Path) -> tuple[np.ndarray, np.ndarray] | None:
    def find(name: str) -> Path | None:
        return next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)
    images, labels = find("train-images-idx3-ubyte"), find("train-labels-idx1-ubyte")
    if images is None or labels is None:
        return None
    x = (read_idx(images).astype(np.float32) / 255 - 0.1307) / 0.3081
    return x[..., None], read_idx(labels).astype(np.int64)


def generated(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    patterns = rng.standard_normal((10, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, samples)
    return 0.5 * patterns[labels] + rng.standard_normal((samples, 28, 28, 1), dtype=np.float32), labels


def build_and_compile_model(lr: float) -> tf.keras.Model:
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(16, 5, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 5, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=lr, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


class EpochLines(tf.keras.callbacks.Callback):
    """One line per epoch on the chief, instead of Keras's progress bar."""

    def __init__(self, chief: bool) -> None:
        super().__init__()
        self.chief = chief

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.chief:
            logs = logs or {}
            print(f"epoch {epoch + 1}: loss {logs['loss']:.4f} accuracy {logs['accuracy']:.3f}", flush=True)


def main() -> None:
    args = parse_args()
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    # The strategy reads TF_CONFIG and joins the other workers' collective ops; make it before anything else.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1  # a worker may hold several GPUs (replicas)
    index = tf_config.get("task", {}).get("index", 0)
    chief = index == 0
    tf.keras.utils.set_random_seed(args.seed)
    gpus = tf.config.list_physical_devices("GPU")
    print(f"rank {index}/{workers} on {socket.gethostname()}, {len(gpus)} GPUs" if gpus else
          f"rank {index}/{workers} on {socket.gethostname()}, CPU", flush=True)

    data = mnist(Path(args.data))
    if data is None:
        if chief:
            print(f"no MNIST idx files in {args.data}: using generated data of the same shape", flush=True)
        data = generated(args.samples or 60000, args.seed)
    x, y = (a[:args.samples] for a in data) if args.samples else data

    global_batch = args.batch_size * workers
    options = tf.data.Options()
    # In-memory data has no files to split: every worker reads every `workers`-th sample of each batch.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=args.seed)
               .batch(global_batch, drop_remainder=True).with_options(options))
    steps = len(x) // global_batch
    if chief:
        print(f"{len(x)} samples, global batch {global_batch} ({args.batch_size} a worker), {steps} steps an epoch",
              flush=True)

    with strategy.scope():
        model = build_and_compile_model(args.lr * workers)
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=[EpochLines(chief)])

    path = Path(args.checkpoint)
    scratch = None if chief else Path(tempfile.mkdtemp(prefix=f"worker-{index}-"))
    target = path if chief else scratch / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    model.save(target)
    if chief:
        print(f"saved checkpoint {path.resolve()}", flush=True)
    else:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
