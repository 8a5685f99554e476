#!/bin/sh
# kit prepare --slurm on a host without systemd: start a daemon unless it already runs on the files it was started
# with; restart it when they changed since. Prints "started NAME" or "restarted NAME" when it did (Ansible's
# "changed"), nothing when the daemon runs as it should.
#   daemon.sh NAME PIDFILE LOGFILE "FILE..." -- COMMAND...
set -u
name=$1 pidfile=$2 log=$3 files=$4
shift 5
stamp=$pidfile.kit  # what the running daemon was started on: the checksum of its files
# shellcheck disable=SC2086 # files: a list of paths, split on purpose
sum=$(cat $files 2>/dev/null | sha256sum | cut -d' ' -f1)

running() {  # the pid file names a live process of that name (not a stale file whose pid was reused)
    pid=$(cat "$pidfile" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
        case "$(cat "/proc/$pid/comm" 2>/dev/null)" in "$name"*) true ;; *) false ;; esac
}

waits() {  # waits WHAT TEST: up to 10 s for TEST to hold
    i=0
    until eval "$2"; do
        i=$((i + 1))
        if [ $i -gt 100 ]; then
            echo "$name $1 within 10 s; the end of $log:" >&2
            tail -n 5 "$log" >&2 2>/dev/null
            exit 1
        fi
        sleep 0.1
    done
}

did=started
if running; then
    [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ] && exit 0
    kill "$pid"
    # shellcheck disable=SC2016 # waits evaluates it
    waits "(pid $pid) did not stop" '! kill -0 "$pid" 2>/dev/null'
    did=restarted
fi
rm -f "$stamp"
"$@" || { echo "$name did not start: $*" >&2; tail -n 5 "$log" >&2 2>/dev/null; exit 1; }
waits "wrote no pid file $pidfile" running
(umask 077 && echo "$sum" > "$stamp")  # a checksum of the munge key is the host's business only
echo "$did $name"
