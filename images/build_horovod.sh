#!/bin/sh
# Build a Horovod wheel from its source archive (the sdist of a release, or an
# archive of a source URL, resolved by kit on the building machine) against the
# torch in the active venv, offline, with two fixes:
# - Horovod 0.28.1 hard-codes C++14, which torch >= 2.1 headers reject; upstream
#   switched to C++17 after the release, so the same switch is applied here.
# - horovodrun starts remote ranks with ssh host-key checking switched off, which
#   overrides kit's pinned known_hosts: anyone could impersonate a worker. It is
#   turned back on; kit's known_hosts holds every container's key.
# Sources that already have either fix are unchanged.
#   usage: build_horovod.sh ARCHIVE OUTPUT_DIR
set -eu
[ "$#" -eq 2 ] && [ -f "$1" ] || { echo "build_horovod.sh: usage: build_horovod.sh ARCHIVE OUTPUT_DIR (got: $*)" >&2; exit 2; }
archive=$1 out=$2
spec=$(basename "$archive")
work=$(mktemp -d)
python -c 'import shutil, sys; shutil.unpack_archive(sys.argv[1], sys.argv[2])' "$archive" "$work/src"
src=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d | head -n 1)
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
done
if grep -n 'CXX_STANDARD 14\|std=c++14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; then
    echo "build_horovod.sh: $spec still asks for C++14 (lines above); torch >= 2.1 needs C++17" >&2
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

def _kit_bind_address():
    # kit: the host's cluster address, so that Horovod's servers listen on the cluster network only.
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
sed -i 's/StrictHostKeyChecking=no/StrictHostKeyChecking=yes/' "$src/horovod/runner/util/remote.py"
if grep -rn 'StrictHostKeyChecking=no' "$src/horovod" --include='*.py' | grep -v '/test'; then
    echo "build_horovod.sh: $spec turns host-key checking off (lines above); kit will not ship that" >&2
    exit 1
fi
pip wheel --no-cache-dir --no-index --no-deps --no-build-isolation -w "$out" "$src"
rm -rf "$work"
