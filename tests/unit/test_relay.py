"""The image relay's listener takes the layers only from the hosts kit named (kit/relay.py). Linux routes all of
127/8 on lo, so sockets bound to 127.0.0.2 and 127.0.0.3 stand for two hosts of the lab network."""

import socket

from kit.image import relay

TOKEN = "t" * 32


def _from(source: str, address: tuple) -> socket.socket:
    return socket.create_connection(address, timeout=5, source_address=(source, 0))


def test_the_relay_accepts_only_the_expected_peer():
    """A stranger that has the token (sniffed: it crosses the network in clear) is closed unread; the peer is served."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = listener.getsockname()
        stranger = _from("127.0.0.3", address)
        stranger.sendall(TOKEN.encode() + b"\nstolen")  # first in the queue, with the right token
        peer = _from("127.0.0.2", address)
        peer.sendall(TOKEN.encode() + b"\nlayers")
        try:
            upstream = relay.FromPeer(listener, TOKEN, ["127.0.0.2"], 10)
            assert upstream.conn.getpeername()[0] == "127.0.0.2"
            assert upstream.recv(6) == b"layers"
            upstream.conn.close()
            # closed with its bytes unread, the kernel resets the stranger's connection (read ones end in a plain FIN)
            try:
                said = stranger.recv(1)
            except ConnectionResetError:
                said = None
            assert said is None, "the stranger's connection was read before it was closed"
        finally:
            stranger.close()
            peer.close()


def test_a_relay_sends_from_the_address_kit_knows_its_host_by():
    """The listener knows its peer by the address kit reaches that host at, so the sender sends from that one, not
    from whichever of its addresses the route would pick."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        host, port = listener.getsockname()
        forward = relay.Next([["second", host, port, TOKEN]], 10, "127.0.0.2")
        conn, where = listener.accept()
        with conn:
            assert where[0] == "127.0.0.2"
            assert conn.recv(33) == TOKEN.encode() + b"\n"
        forward.close()


def test_addresses_are_compared_in_one_spelling():
    assert relay.same_address("::ffff:10.0.0.2") == "10.0.0.2"
    assert relay.same_address("fe80::1%eth0") == "fe80::1"
    assert relay.same_address("10.0.0.2") == "10.0.0.2"
