# Shell functions that prepare this machine for kit; sourced by cli/demo and tests/run.
# Debian/Ubuntu, as root (Docker and kit's folders in /var/lib/kit need it).
# Each function does nothing when its work is already done.

say() { echo "${KIT_SCRIPT:-kit}: $*"; }

need_root() { [[ $(id -u) == 0 ]] || { say "run it as root: sudo $0"; exit 2; }; }

# install_packages [--no-services] COMMAND=PACKAGE...: install the package of each command that is missing.
# --no-services: start no service while installing (no system sshd or dockerd on a test machine).
install_packages() {
    local quiet_services="" need=() pair
    [[ ${1:-} == --no-services ]] && { quiet_services=1; shift; }
    for pair in "$@"; do
        local cmd=${pair%%=*} pkg=${pair#*=}
        if [[ $cmd == /* ]]; then [[ -x $cmd ]] || need+=("$pkg"); else command -v "$cmd" >/dev/null || need+=("$pkg"); fi
    done
    python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
    ((${#need[@]})) || return 0
    say "installing ${need[*]}"
    local policy=""
    if [[ -n $quiet_services && ! -e /usr/sbin/policy-rc.d ]]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    [[ -z $policy ]] || rm -f "$policy"
}

docker_answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# start_dockerd LOG: start the Docker engine when none answers (no systemd here); STARTED_DOCKERD is its pid.
start_dockerd() {
    docker_answers && return 0
    say "starting dockerd (log: $1)"
    setsid dockerd >"$1" 2>&1 </dev/null &
    STARTED_DOCKERD=$!
    for _ in $(seq 60); do docker_answers && return 0; sleep 1; done
    say "dockerd did not answer within 60 s; its log ends with:"; tail -n 20 "$1"; exit 1
}

stop_dockerd() {
    [[ -n ${STARTED_DOCKERD:-} ]] || return 0
    kill "$STARTED_DOCKERD" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || return 0; sleep 1; done
}

# install_kit [EXTRAS]: kit (editable, so this checkout is what runs) in .venv.
install_kit() {
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${1:-}"
}
