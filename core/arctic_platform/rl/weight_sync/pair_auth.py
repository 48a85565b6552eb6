"""``PairAuth``: the two sides of a weight-sync pair prove to each other that they hold the
sync's secret.

A pair's TCP store accepts any connection that reaches its port, and every key in it can be
read by any client. So nothing secret is ever written there: each control message is written
with an HMAC-SHA256 of the secret over the message, its key and the pair's port, and the
name under which the two sides build their process group is derived from the secret on both
sides (never written), so a stray connection can neither pass for a peer nor join the group.
Without a secret (standalone use on one host) messages are written as they are.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from arctic_platform.rl.errors import StrayPeerError


def new_secret() -> str:
    """A fresh random secret for one trainer's pairs (256 bits, hex)."""
    return secrets.token_hex(32)


class PairAuth:
    """Signs and checks the control messages of one pair (one port)."""

    def __init__(self, secret: str | None, port: int) -> None:
        self._key = secret.encode() if secret else None
        self.port = port

    @property
    def enabled(self) -> bool:
        """True when messages are signed (a secret was given)."""
        return self._key is not None

    def _mac(self, label: str, value: str) -> str:
        assert self._key is not None
        text = f"{self.port}|{label}|{value}".encode()
        return hmac.new(self._key, text, hashlib.sha256).hexdigest()

    def sign(self, label: str, value: str) -> str:
        """``value`` as written under ``label`` (a key name): with its MAC when enabled."""
        if self._key is None:
            return value
        return f"{value}#{self._mac(label, value)}"

    def check(self, label: str, signed: str) -> str:
        """The value of a message read under ``label``; StrayPeerError if its MAC is wrong."""
        if self._key is None:
            return signed
        value, sep, mac = signed.rpartition("#")
        if not sep or not hmac.compare_digest(mac, self._mac(label, value)):
            raise StrayPeerError(
                f"a message on weight-sync port {self.port} ({label.rsplit('/', 1)[-1]!r}) did "
                "not carry this sync's secret: refused (a stray connection, not the peer)"
            )
        return value

    def group_name(self, public: str) -> str:
        """The process-group prefix both sides derive from the public part ``public``."""
        if self._key is None:
            return public
        return f"pg/{self._mac('group', public)[:32]}"
