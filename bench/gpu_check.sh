#!/usr/bin/env bash
# kit's Horovod recipe on a machine with a GPU, without Docker: build Horovod with NCCL against this machine's
# CUDA torch exactly as the gpu image does (images/build_horovod.sh), then run the image's checks on the GPUs:
# CUDA tensors allreduced through NCCL by Horovod and by torch.distributed (nccl backend), and the CIFAR-10
# example, with images/sec. Prints figures; passes or fails on nothing but whether it could run.
#
#   bench/gpu_check.sh [HOROVOD_SDIST] [WHEELS_DIR]
#
# PYTHON (default python3) must import a CUDA build of torch that sees the GPU. HOROVOD_SDIST: Horovod's source
# archive (default: `pip download horovod==0.28.1`); WHEELS_DIR: a folder of wheels for what the build needs and
# this Python lacks (setuptools, wheel, cffi, pycparser, cmake), for a machine without an index. CUDA: the
# toolkit at HOROVOD_CUDA_HOME, else /usr/local/cuda, else torch's own CUDA wheels (nvidia/cu13); NCCL: torch's.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
say() { echo "gpu_check: $*"; }

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [[ ${gpus:-0} -eq 0 ]]; then
    say "no GPU is visible here (nvidia-smi lists none): run it on a machine with a GPU and a CUDA build of torch"
    exit 2
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)' 2>/dev/null; then
    say "$PY has no CUDA build of torch that sees the GPU: set PYTHON to one (pip install torch from its CUDA index)"
    exit 2
fi
work=$(mktemp -d /tmp/kit-gpu-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$work/site/bin:$PATH"
sdist=${1:-}
if [[ -z $sdist ]]; then
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation -d "$work/sdist" horovod==0.28.1
    sdist=$(ls "$work"/sdist/horovod-*)
fi
links=${2:+--find-links $2}
# What the build needs beside torch, where this Python lacks it (kept apart, on PYTHONPATH, like a venv's).
"$PY" -m pip install --quiet --target "$work/site" $links setuptools wheel cffi "cmake>=3.24"
mkdir -p "$work/site/bin" && ln -sf "$(command -v "$PY")" "$work/site/bin/python"  # build_horovod.sh runs `python`
[[ -n ${HOROVOD_CUDA_HOME:-} || ! -x /usr/local/cuda/bin/nvcc ]] || export HOROVOD_CUDA_HOME=/usr/local/cuda
site=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
if [[ -z ${HOROVOD_NCCL_HOME:-} && -f $site/nvidia/nccl/lib/libnccl.so.2 ]]; then
    export HOROVOD_NCCL_HOME="$work/nccl"  # torch's own NCCL, with the libnccl.so name Horovod links
    mkdir -p "$HOROVOD_NCCL_HOME/lib"
    ln -s "$site/nvidia/nccl/include" "$HOROVOD_NCCL_HOME/include"
    ln -s "$site/nvidia/nccl/lib/libnccl.so.2" "$HOROVOD_NCCL_HOME/lib/libnccl.so"
    ln -s "$site/nvidia/nccl/lib/libnccl.so.2" "$HOROVOD_NCCL_HOME/lib/libnccl.so.2"
fi
say "$gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1); torch" \
    "$("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "archs", *torch.cuda.get_arch_list())')"
started=$(date +%s)
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
    PATH="$work/site/bin:$PATH" sh "$here/images/build_horovod.sh" "$sdist" "$work/dist" >"$work/build.log" 2>&1 \
    || { tail -n 30 "$work/build.log"; say "the Horovod build failed (its log's tail is above)"; exit 1; }
built=$(($(date +%s) - started))
"$PY" -m pip install --quiet --no-deps --target "$work/site" "$work"/dist/horovod-*.whl
say "Horovod built with NCCL in ${built} s on $(nproc) cores ($(grep -m1 'CUDA .* from' "$work/build.log" || true))"
"$work/site/bin/horovodrun" --check-build | sed -n '/Available Tensor Operations/,$p'
horovodrun -np "$gpus" -H "localhost:$gpus" "$PY" "$here/images/allreduce_check.py" --cuda
"$PY" -m torch.distributed.run --standalone --nproc-per-node "$gpus" "$here/images/allreduce_check.py" --ddp
cd "$work"
horovodrun -np "$gpus" -H "localhost:$gpus" "$PY" "$here/examples/cifar10_cnn_horovod.py" --epochs 3 --samples 20000 \
    | grep -E 'device|epoch'
