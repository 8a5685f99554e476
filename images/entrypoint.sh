#!/bin/sh
# kit container entrypoint. With no command (or "sshd") it runs the cluster sshd
# in the foreground as the container's main process; anything else is exec'd.
set -eu

if [ "$#" -eq 0 ] || [ "$1" = "sshd" ]; then
    key=/etc/kit/ssh/ssh_host_ed25519_key
    if [ ! -s "$key" ] || [ ! -s /etc/kit/ssh/authorized_keys ]; then
        echo "kit: no host key or authorized_keys in /etc/kit/ssh; start cluster containers with 'kit up'" >&2
        exit 78
    fi
    mkdir -p /run/sshd
    # On the host's network, listen on its cluster address only (kit up writes it), not on every interface.
    address=$(cat /etc/kit/ssh/address 2>/dev/null || true)
    exec /usr/sbin/sshd -D -e -p "${KIT_SSH_PORT:-12345}" ${address:+-o "ListenAddress=$address"}
fi
exec "$@"
