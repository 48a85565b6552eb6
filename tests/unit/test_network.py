"""This node's loopback interface, looked up from the kernel (for ``GLOO_SOCKET_IFNAME``)."""

from __future__ import annotations

import socket

import pytest

from arctic_platform.rl.network import _interface_ipv4, listening_socket, loopback_interface


def test_the_loopback_interface_is_found_by_its_flag_and_holds_a_127_address():
    name = loopback_interface()
    assert name is not None
    assert name in [n for _, n in socket.if_nameindex()]
    address = _interface_ipv4(name)
    assert address is not None and address.startswith("127.")
    # a socket bound to that interface reaches 127.0.0.1 (what our process groups use)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((address, 0))
        server.listen(1)
        with socket.create_connection(("127.0.0.1", server.getsockname()[1]), timeout=5):
            pass


def test_listening_socket_listens_and_a_taken_port_is_an_oserror():
    first = listening_socket("127.0.0.1", 0, 4)
    try:
        port = first.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with pytest.raises(OSError):
            listening_socket("127.0.0.1", port, 4)
    finally:
        first.close()
