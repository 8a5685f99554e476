#!/bin/sh
# Build a Horovod wheel from its source archive (the sdist of a release, or an
# archive of a source URL, resolved by kit on the building machine) against the
# torch in the active venv, offline, with these fixes, each checked and skipped
# where the source already has it:
# - Horovod 0.28.1 hard-codes C++14, which torch >= 2.1 headers reject; upstream
#   switched to C++17 after the release, so the same switch is applied here
#   (C++20 where torch's headers require it, as torch 2.14's do).
# - CMake 4 refuses the bundled gloo's cmake_minimum_required(2.8.12): raised to 3.5.
# - GCC 13 needs <string>, <stdexcept>, <cstdint> included where they are used;
#   GCC 14 refuses the bundled flatbuffers' span::operator= (assigns const members).
# - horovodrun starts remote ranks with ssh host-key checking switched off, which
#   overrides kit's pinned known_hosts: anyone could impersonate a worker. It is
#   turned back on; kit's known_hosts holds every container's key.
# - Horovod's servers listen on every interface, on any port: they listen on the
#   host's cluster address, on a port of its ephemeral range (see below); a job's
#   rendezvous on the address its ranks are given (the primary's on the training
#   network kit chose, or loopback for a job on this host alone).
# - A process set's Gloo device (the global set's too, over which every collective
#   goes) ignores HOROVOD_GLOO_IFACE and takes the address the host's name resolves to:
#   it takes the interface the global context was given (the training network kit chose).
# - A rank waiting for an operation (torch's synchronize) spins a core, which starves
#   Gloo's own threads where ranks share cores: it polls with short sleeps instead.
# - horovodrun imports distutils, which Python 3.12 removed: shutil.which instead.
# - Built as Release (setup.py says RelWithDebInfo): no debug info, a quicker build, a smaller wheel.
# With HOROVOD_GPU_OPERATIONS=NCCL and no HOROVOD_CUDA_HOME, the CUDA compiler and
# NCCL are the venv's wheels of torch's own CUDA (one CUDA in the image, not two).
#   usage: build_horovod.sh ARCHIVE OUTPUT_DIR
set -eu
[ "$#" -eq 2 ] && [ -f "$1" ] || { echo "build_horovod.sh: usage: build_horovod.sh ARCHIVE OUTPUT_DIR (got: $*)" >&2; exit 2; }
archive=$1 out=$2
spec=$(basename "$archive")
work=$(mktemp -d)
python -c 'import shutil, sys; shutil.unpack_archive(sys.argv[1], sys.argv[2])' "$archive" "$work/src"
src=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d | head -n 1)
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# C++17 for torch >= 2.1; C++20 where torch's headers ask for it (torch 2.14 does)
cxx=17
if grep -qs 'C++20 or later' "$site/torch/include/ATen/ATen.h"; then
    cxx=20
fi
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    sed -i "s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $cxx)/" "$f"
done
if grep -n 'CXX_STANDARD 14\|std=c++14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; then
    echo "build_horovod.sh: $spec still asks for C++14 (lines above); torch needs C++$cxx" >&2
    exit 1
fi
# CMake 4 refuses cmake_minimum_required below 3.5, which the bundled gloo declares (2.8.12); raised to 3.5
# where lower (they use nothing that older CMake had and 3.5 lacks).
for f in $(grep -rlE --include=CMakeLists.txt 'cmake_minimum_required *\( *VERSION +(2\.|3\.[0-4]([^0-9]|$))' \
               "$src/third_party" || true); do
    sed -i -E 's/cmake_minimum_required *\( *VERSION +(2\.[0-9.]+|3\.[0-4](\.[0-9]+)*)/cmake_minimum_required(VERSION 3.5/' "$f"
done
if grep -rnE --include=CMakeLists.txt 'cmake_minimum_required *\( *VERSION +(2\.|3\.[0-4]([^0-9]|$))' \
        "$src/third_party/gloo" "$src/third_party/compatible_gloo" "$src/third_party/compatible17_gloo" 2>/dev/null; then
    echo "build_horovod.sh: $spec still asks for CMake < 3.5 (lines above); CMake 4 refuses it" >&2
    exit 1
fi
# GCC 13 no longer brings <string>, <stdexcept> or <cstdint> in through other standard headers: Horovod's own
# headers that use them without including them get the include (where they have it already, nothing changes).
python - "$src/horovod/common" <<'PATCH'
import pathlib, re, sys
needs = {"<string>": r"\bstd::(string|to_string)\b", "<stdexcept>": r"\bstd::(logic_error|runtime_error|invalid_argument|out_of_range)\b",
         "<cstdint>": r"\b(u?int(8|16|32|64)_t)\b"}
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.h")):
    text = path.read_text()
    missing = [h for h, use in needs.items() if re.search(use, text) and f"#include {h}" not in text]
    first = re.search(r"^#include .*$", text, re.M)
    if missing and first:
        text = text[:first.start()] + "".join(f"#include {h}  // kit: GCC 13\n" for h in missing) + text[first.start():]
        path.write_text(text)
PATCH
# GCC 14 rejects the bundled flatbuffers' span::operator=, which assigns to its const members (never callable, so
# never used): removed.
python - "$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h" <<'PATCH'
import pathlib, re, sys
path = pathlib.Path(sys.argv[1])
if path.exists():
    text, n = re.subn(r"\n *FLATBUFFERS_CONSTEXPR_CPP14 span &operator=\(const span &other\)\s*FLATBUFFERS_NOEXCEPT \{"
                      r"\s*data_ = other\.data_;\s*count_ = other\.count_;\s*\}\n", "\n", path.read_text())
    if n:
        path.write_text(text)
PATCH
if grep -n 'count_ = other.count_' "$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h" 2>/dev/null; then
    echo "build_horovod.sh: $spec's flatbuffers assigns to a const member (line above); GCC 14 refuses it" >&2
    exit 1
fi
# Horovod's rendezvous and task services listen on every interface, on any port from 1024 (the rendezvous has
# no authentication: CVE-2024-10190 is of this kind). They are made to listen on the host's cluster address
# (kit up writes it to /etc/kit/ssh/address) and on a port of the host's ephemeral range, the range kit's
# firewall role keeps to the cluster. Without that file (kit build's check, compose) nothing changes.
python - "$src/horovod/runner/util/network.py" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
if "_kit_bind_address" not in text:
    old_range, old_addr = "    min_port = 1024\n    max_port = 65536\n", "addr = ('', port)"
    if old_range not in text or old_addr not in text:
        sys.exit(f"build_horovod.sh: {path} binds its servers differently than kit expects; see kit's patch")
    text = text.replace(old_range, "    min_port, max_port = _kit_port_range()\n").replace(
        old_addr, "addr = (_kit_bind_address(), port)")
    text += """

_kit_address = None  # set by gloo_run for its rendezvous: the address its ranks are sent to


def _kit_bind_address():
    # kit: the host's cluster address (a rendezvous: where its ranks are sent), so that Horovod's servers listen
    # on the cluster's networks only.
    if _kit_address:
        return _kit_address
    try:
        with open('/etc/kit/ssh/address') as f:
            return f.read().strip()
    except OSError:
        return ''


def _kit_port_range():
    # kit: the host's ephemeral ports, the range kit's firewall role keeps to the cluster's addresses.
    try:
        with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
            low, high = (int(x) for x in f.read().split())
        return low, high + 1
    except (OSError, ValueError):
        return 1024, 65536
"""
    open(path, "w").write(text)
PATCH
# The rendezvous of a static Gloo job listens on the address horovodrun sends its ranks to (its driver's, on the
# interface kit names: the training network; loopback for a job on this host alone, where horovodrun refuses any
# other interface), and on no other.
python - "$src/horovod/runner/gloo_run.py" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
old = "    global_rendezv_port = rendezvous.start()\n    rendezvous.init(host_alloc_plan)\n"
if "_kit_address" not in text:
    if text.count(old) != 1:
        sys.exit(f"build_horovod.sh: {path} starts its rendezvous differently than kit expects; see kit's patch")
    text = text.replace(old, "    network._kit_address = server_ip  # kit: where its ranks are sent, and only there\n" + old)
    open(path, "w").write(text)
PATCH
# Every collective goes over a process set's Gloo context (the global set is one), whose device Horovod 0.28 makes
# with no interface: the address of the host's name, whatever HOROVOD_GLOO_IFACE says. It takes the global context's.
python - "$src/horovod/common/gloo/gloo_context.cc" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
start = text.find("void GlooContext::InitializeForProcessSet(")
old = "  device_attr.iface = gloo_iface_;\n"
if "kit: the process set's device" not in text:
    if start < 0 or text.find(old, start) < 0:
        sys.exit(f"build_horovod.sh: {path} makes a process set's Gloo device differently than kit expects")
    at = text.find(old, start)
    text = (text[:at] + "  gloo_iface_ = global_context.gloo_iface_;  // kit: the process set's device on HOROVOD_GLOO_IFACE\n"
            + text[at:])
    open(path, "w").write(text)
PATCH
# torch's synchronize() waits for an operation by polling in a loop that only yields: a whole core a rank. Where
# ranks share cores with Gloo's threads (CPU training, a rank a core) that halves allreduce throughput and makes it
# jump (measured: bench/allreduce.py). It polls with short sleeps instead: 20 us doubling to 200 us after 50 us.
python - "$src/horovod/torch/mpi_ops_v2.cc" <<'PATCH'
import re, sys
path = sys.argv[1]
text = open(path).read()
spin = re.compile(r"  while \(true\) \{\n    if \(handle_manager\.PollHandle\(handle\)\) break;\n    \{\n"
                  r"      py::gil_scoped_release release_python_gil;\n      std::this_thread::yield\(\);\n    \}\n  \}\n")
if "kit_nap" not in text and spin.search(text):
    text = spin.sub(lambda m: """\
  // kit: poll without spinning a core (it starves Gloo's threads where ranks share cores).
  auto kit_spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  auto kit_nap = std::chrono::microseconds(20);
  while (!handle_manager.PollHandle(handle)) {
    py::gil_scoped_release release_python_gil;
    if (std::chrono::steady_clock::now() < kit_spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kit_nap);
      kit_nap = std::min(kit_nap * 2, std::chrono::microseconds(200));
    }
  }
""", text, count=1)
    if "#include <algorithm>" not in text:
        text = text.replace("#include <chrono>\n", "#include <algorithm>  // kit\n#include <chrono>\n", 1)
    open(path, "w").write(text)
elif "kit_nap" not in text:
    sys.exit(f"build_horovod.sh: {path} waits for an operation differently than kit's patch expects; see kit's patch")
PATCH
sed -i 's/StrictHostKeyChecking=no/StrictHostKeyChecking=yes/' "$src/horovod/runner/util/remote.py"
if grep -rn 'StrictHostKeyChecking=no' "$src/horovod" --include='*.py' | grep -v '/test'; then
    echo "build_horovod.sh: $spec turns host-key checking off (lines above); kit will not ship that" >&2
    exit 1
fi
# Python 3.12 has no distutils, and horovodrun imports it (js_run.py); shutil's which is the same function.
sed -i 's/^from distutils.spawn import find_executable$/from shutil import which as find_executable/' \
    "$src/horovod/runner/js_run.py"
if grep -rn --include='*.py' '^from distutils\|^import distutils' "$src/horovod/runner"; then
    echo "build_horovod.sh: $spec's horovodrun imports distutils (lines above), which Python 3.12 lacks" >&2
    exit 1
fi
# NCCL without a CUDA base: the compiler, headers and NCCL come as wheels of torch's own CUDA, in this venv.
if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ]; then
    if [ -z "${HOROVOD_CUDA_HOME:-}" ]; then
        if [ -x "$site/nvidia/cu13/bin/nvcc" ]; then  # CUDA 13's wheels share one tree
            HOROVOD_CUDA_HOME=$site/nvidia/cu13
        elif [ -x "$site/nvidia/cuda_nvcc/bin/nvcc" ]; then  # CUDA 12's: one tree a wheel, made into one
            HOROVOD_CUDA_HOME=$work/cuda
            mkdir -p "$HOROVOD_CUDA_HOME"
            for part in cuda_nvcc cuda_runtime cuda_cccl; do
                [ -d "$site/nvidia/$part" ] && cp -rs "$site/nvidia/$part/." "$HOROVOD_CUDA_HOME/"
            done
        else
            echo "build_horovod.sh: no nvcc in $site/nvidia: install torch's CUDA compiler wheels" \
                 "(cuda-toolkit[nvcc,cccl]) or set HOROVOD_CUDA_HOME to a CUDA toolkit" >&2
            exit 1
        fi
        # nvcc and CMake look for libcudart_static.a and libcudadevrt.a in lib64, and CMake for libcudart.so; the
        # wheels have lib and libcudart.so.N (links made in the builder stage only)
        [ -e "$HOROVOD_CUDA_HOME/lib64" ] || ln -s lib "$HOROVOD_CUDA_HOME/lib64"
        for so in "$HOROVOD_CUDA_HOME"/lib/libcudart.so.[0-9]*; do
            [ -e "$so" ] && [ ! -e "$HOROVOD_CUDA_HOME/lib/libcudart.so" ] && ln -s "$(basename "$so")" "$HOROVOD_CUDA_HOME/lib/libcudart.so"
        done
        export HOROVOD_CUDA_HOME
    fi
    if [ -z "${HOROVOD_NCCL_HOME:-}" ] && [ -f "$site/nvidia/nccl/lib/libnccl.so.2" ]; then
        export HOROVOD_NCCL_HOME=$site/nvidia/nccl  # the NCCL torch itself loads
        [ -e "$HOROVOD_NCCL_HOME/lib/libnccl.so" ] || ln -s libnccl.so.2 "$HOROVOD_NCCL_HOME/lib/libnccl.so"
    fi
    export PATH="$HOROVOD_CUDA_HOME/bin:$PATH"
    echo "build_horovod.sh: CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') from $HOROVOD_CUDA_HOME," \
         "NCCL from ${HOROVOD_NCCL_HOME:-the CUDA toolkit}"
fi
# Release, not setup.py's RelWithDebInfo: the same -O3 code without debug info. Measured on 2 cores for the cpu
# flavor: 209 s instead of 290 s, and a 1.1 MB wheel instead of 18.6 MB.
sed -i "s/ else 'RelWithDebInfo'$/ else 'Release'/" "$src/setup.py"
python -m pip wheel --no-cache-dir --no-index --no-deps --no-build-isolation -w "$out" "$src"
rm -rf "$work"
