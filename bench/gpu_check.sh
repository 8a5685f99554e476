#!/usr/bin/env bash
# kit's Horovod recipe on a machine with a GPU, without Docker: build Horovod with NCCL against this machine's
# CUDA torch exactly as the gpu image does (images/build_horovod.sh), then run the image's checks on the GPUs:
# CUDA tensors allreduced through NCCL by Horovod and by torch.distributed (nccl backend), and the CIFAR-10
# example, with images/sec. Prints figures; passes or fails on nothing but whether it could run.
#
#   bench/gpu_check.sh [HOROVOD_SDIST | HOROVOD_WHEEL] [WHEELS_DIR]
#
# PYTHON (default python3) must import a CUDA build of torch that sees the GPU. HOROVOD_SDIST: Horovod's source
# archive (default: `pip download horovod==0.28.1`); WHEELS_DIR: a folder of wheels for what the build needs and
# this Python lacks (setuptools, wheel, cffi, pycparser, cmake), for a machine without an index. CUDA: the
# toolkit at HOROVOD_CUDA_HOME, else /usr/local/cuda, else torch's own CUDA wheels (nvidia/cu13); NCCL: torch's.
# KEEP=DIR keeps the wheel and the build's log there; given as HOROVOD_WHEEL, that wheel runs the checks unbuilt.
# HOROVOD_BUILD_CUDA_CC_LIST=90 (say) builds Horovod's kernels for those GPUs alone, as build.cuda_archs does.
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
links=${2:+--no-index --find-links $2}
# What the build needs beside torch, where this Python lacks it (kept apart, on PYTHONPATH, like a venv's).
need=()
for module in setuptools wheel cffi; do
    "$PY" -c "import $module" 2>/dev/null || need+=("$module")
done
cmake_ok=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' \
           | awk '{ print ($1 > 3 || ($1 == 3 && $2 >= 24)) ? "yes" : "no" }')
[[ $cmake_ok == yes ]] || need+=("cmake>=3.24")
if (( ${#need[@]} )); then
    say "installing what the build needs and $PY lacks: ${need[*]}"
    "$PY" -m pip install --quiet --target "$work/site" $links "${need[@]}"
fi
# build_horovod.sh runs `python`: this Python, called by its own path (a link would lose a venv's site-packages)
mkdir -p "$work/bin" && printf '#!/bin/sh\nexec %q "$@"\n' "$(command -v "$PY")" >"$work/bin/python"
chmod +x "$work/bin/python"
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
mkdir -p "$work/dist"
if [[ $sdist == *.whl ]]; then  # a wheel this script built before (KEEP): the checks again, without the build
    cp "$sdist" "$work/dist/"
    say "Horovod from $sdist, not built"
else
    started=$(date +%s)
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
        PATH="$work/bin:$PATH" sh "$here/images/build_horovod.sh" "$sdist" "$work/dist" >"$work/build.log" 2>&1 \
        || { tail -n 30 "$work/build.log"; [[ -z ${KEEP:-} ]] || { mkdir -p "$KEEP" && cp "$work/build.log" "$KEEP"/; }
             say "the Horovod build failed (its log's tail is above)"; exit 1; }
    say "Horovod built with NCCL in $(($(date +%s) - started)) s on $(nproc) cores" \
        "($(grep -m1 'CUDA .* from' "$work/build.log" || true))"
    if [[ -n ${KEEP:-} ]]; then  # the wheel and the build's log, for a rerun or a look
        mkdir -p "$KEEP" && cp "$work"/dist/horovod-*.whl "$work/build.log" "$KEEP"/
    fi
fi
# Horovod in a target of its own: pip leaves a folder out of a target where it is there already (bin, from cmake)
"$PY" -m pip install --quiet --no-deps --target "$work/horovod" "$work"/dist/horovod-*.whl
export PYTHONPATH="$work/horovod:$PYTHONPATH" PATH="$work/horovod/bin:$PATH"
horovodrun --check-build | sed -n '/Available Tensor Operations/,$p'
horovodrun -np "$gpus" -H "localhost:$gpus" "$PY" "$here/images/allreduce_check.py" --cuda
"$PY" -m torch.distributed.run --standalone --nproc-per-node "$gpus" "$here/images/allreduce_check.py" --ddp
# `kit bench allreduce`'s job on this machine's GPUs: the time of one allreduce (the slowest rank's), algbw (size /
# time) and busbw (algbw x 2(n-1)/n, nccl-tests' figure). One GPU moves no byte between GPUs: its times are what each
# library spends on an operation, and no bandwidth is printed for them.
bandwidths() {
    "$PY" -c '
import json, sys
for line in sys.stdin:
    if "@@kit-bench " in line:  # also after a [rank]<stdout>: prefix
        r = json.loads(line.split("@@kit-bench ", 1)[1])
        backend, transport, n, size, seconds = r["backend"], r["transport"], r["ranks"], r["bytes"], r["seconds"]
        algbw = size / seconds / 1e9
        figures = f"  algbw {algbw:8.2f} GB/s  busbw {algbw * 2 * (n - 1) / n:8.2f} GB/s" if n > 1 else ""
        print(f"  {backend:8} {transport:5} ranks {n} {size:>11} B {seconds * 1e6:10.1f} us{figures}")'
}
say "kit bench allreduce's job, Horovod (NCCL):"
horovodrun -np "$gpus" -H "localhost:$gpus" "$PY" "$here/cli/kit/bench/jobs/allreduce.py" horovod --seconds 0.5 \
    | bandwidths
say "kit bench allreduce's job, torch.distributed (nccl):"
"$PY" -m torch.distributed.run --standalone --nproc-per-node "$gpus" "$here/cli/kit/bench/jobs/allreduce.py" torch \
    --seconds 0.5 | bandwidths
cd "$work"
say "the CIFAR-10 example (Horovod, generated data of CIFAR's shape where no batches are here):"
horovodrun -np "$gpus" -H "localhost:$gpus" "$PY" "$here/examples/cifar10_cnn_horovod.py" --epochs 3 --samples 20000 \
    | grep -E 'device|epoch'
say "the DDP example (torchrun, nccl):"
"$PY" -m torch.distributed.run --standalone --nproc-per-node "$gpus" "$here/examples/ddp_train.py" --epochs 2 \
    | grep -vE '^\s*$' | tail -n 6
