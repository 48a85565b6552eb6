"""This node's addresses, read from the kernel's tables: never by sending a packet."""

from __future__ import annotations

import fcntl
import socket
import struct

LOOPBACK = "127.0.0.1"
_SIOCGIFADDR = 0x8915
_SIOCGIFFLAGS = 0x8913
_IFF_LOOPBACK = 0x8


def _interface_ipv4(ifname: str) -> str | None:
    """The IPv4 address bound to interface ``ifname``, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = struct.pack("256s", ifname.encode()[:15])
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, packed)
    except OSError:
        return None
    return socket.inet_ntoa(raw[20:24])


def _default_route_interfaces(route_table: str = "/proc/net/route") -> list[str]:
    """Interfaces carrying a default route, lowest metric first."""
    try:
        with open(route_table) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    found: list[tuple[int, str]] = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 7 and parts[1] == "00000000" and parts[7:8] != ["FFFFFFFF"]:
            try:
                found.append((int(parts[6]), parts[0]))
            except ValueError:
                continue
    return [name for _, name in sorted(found)]


def primary_ipv4() -> str:
    """The primary routable IPv4 of this node (the default route's), else 127.0.0.1."""
    for ifname in _default_route_interfaces():
        addr = _interface_ipv4(ifname)
        if addr and not addr.startswith("127."):
            return addr
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    for ifname in names:
        if ifname == "lo":
            continue
        addr = _interface_ipv4(ifname)
        if addr and not addr.startswith(("127.", "169.254.")):
            return addr
    return LOOPBACK


def loopback_interface() -> str | None:
    """The name of this node's loopback interface (IFF_LOOPBACK set, holding 127.x), or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for ifname in names:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                raw = fcntl.ioctl(
                    s.fileno(), _SIOCGIFFLAGS, struct.pack("256s", ifname[:15].encode())
                )
        except OSError:
            continue
        flags = struct.unpack_from("H", raw, 16)[0]
        addr = _interface_ipv4(ifname)
        if flags & _IFF_LOOPBACK and addr is not None and addr.startswith("127."):
            return ifname
    return None


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (IPv4 or IPv6) and listening; OSError if it can't."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def accepts_connections(host: str, port: int, timeout: float) -> bool:
    """Whether something listens on ``host:port``: one TCP connect, at most ``timeout`` s.

    A connect to a local port nobody listens on can pick that same port as its source port
    and connect to itself (TCP simultaneous open), which would then hold the port and make
    the real listener's bind fail with EADDRINUSE. Such a self-connection counts as nothing
    listening and is reset at once (no TIME_WAIT), so polling never takes the port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect((host, port))
        except OSError:
            return False
        if probe.getsockname()[:2] != probe.getpeername()[:2]:
            return True
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine's loopback (127.0.0.0/8, ::1, localhost)."""
    return host in ("localhost", "::1") or host.startswith("127.")


def token_rule_violation(host: str, token: str | None) -> str | None:
    """Why serving on ``host`` with ``token`` is refused (no token off loopback, or an empty one).

    ``None`` when it is allowed. Every server entry point (``arctic-rl serve``, the HTTP
    front-ends, the platform server) applies this one rule and raises its own error with it.
    """
    if token is not None and not token.strip():
        return "the token is empty; give a non-empty token, or none (loopback only)"
    if token is None and not is_loopback(host):
        return (
            f"refusing to serve on non-loopback address {host} without a token; give one "
            "(--token-file or ARCTIC_RL_TOKEN) or bind 127.0.0.1"
        )
    return None


def source_address_for(host: str) -> str:
    """This node's IPv4 address on the route to ``host`` (the kernel chooses; nothing is sent).

    A connected UDP socket only looks the route up: no packet leaves. Loopback for loopback.
    """
    if is_loopback(host):
        return LOOPBACK
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP "connect" sends nothing; port 9 is discard, never used
        return str(s.getsockname()[0])


def interface_with_address(address: str) -> str | None:
    """The name of the interface holding IPv4 ``address`` on this node, or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for ifname in names:
        if _interface_ipv4(ifname) == address:
            return ifname
    return None


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` (one of this node's addresses) a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ports_free(host: str, base: int, count: int) -> bool:
    """True when ports ``base .. base+count-1`` can all be bound on ``host`` right now."""
    for port in range(base, base + count):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_range(
    count: int, host: str = LOOPBACK, low: int = 30000, high: int = 60000, tries: int = 100
) -> int:
    """A base port with ``count`` consecutive ports free on ``host`` right now."""
    import random

    for _ in range(tries):
        base = random.randint(low, high - count)
        if ports_free(host, base, count):
            return base
    raise OSError(f"no {count} consecutive free ports in {low}..{high} on {host}")
