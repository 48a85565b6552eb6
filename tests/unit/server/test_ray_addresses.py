"""Ray addresses: parsing, loopback detection and the reachability probe (no Ray needed)."""

from __future__ import annotations

import socket

import pytest

from arctic_platform.rl.server.ray_cluster import (
    driver_node_address,
    is_loopback_address,
    split_address,
    unreachable_reason,
)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("198.18.0.1:6379", ("198.18.0.1", 6379)),
        ("ray://10.0.0.5:10001", ("10.0.0.5", 10001)),
        ("[::1]:6379", ("::1", 6379)),
    ],
)
def test_a_ray_address_splits_into_host_and_port(address, expected):
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["198.18.0.1", "host:port", ":6379"])
def test_an_address_without_a_port_is_refused_with_the_value(address):
    with pytest.raises(ValueError, match="host:port"):
        split_address(address)


def test_loopback_addresses_are_told_apart_from_cluster_ones():
    assert is_loopback_address("127.0.0.1:6379")
    assert not is_loopback_address("198.18.0.1:6379")
    assert not is_loopback_address("garbage")


def test_the_driver_joins_a_loopback_cluster_on_loopback():
    assert driver_node_address("127.0.0.1:6379") == "127.0.0.1"


def test_a_closed_port_is_reported_unreachable_and_an_open_one_is_not():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert unreachable_reason(f"127.0.0.1:{port}") is None
    reason = unreachable_reason(f"127.0.0.1:{port}", timeout=2)
    assert reason is not None and "Refused" in reason
