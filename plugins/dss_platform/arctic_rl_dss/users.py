"""Users of the platform server and their personal access tokens (the ``--tokens`` file).

The file is JSON: ``{"users": [{"name": "alice", "token": "...", "reserved_gpus": 2}]}``
(``reserved_gpus`` optional), or the short form ``{"alice": "token", "bob": "token"}``.
Tokens are compared as SHA-256 digests in constant time; they are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arctic_platform.rl.api import BEARER_REFUSED, ArcticRLError, AuthError, bearer_token
from arctic_rl_dss.models import TOKEN_TYPE, TOKEN_TYPE_HEADER

logger = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
MIN_TOKEN_LENGTH = 16


class TokensFileError(ArcticRLError):
    """A ``--tokens`` file that cannot be read or is malformed (the operator's mistake)."""

    status = 422
    code = "bad_tokens_file"
    remedy = "Fix the tokens file as the message says (JSON: users with name and token)."


@dataclass(frozen=True)
class User:
    """One platform user: a name and an optional GPU reservation."""

    name: str
    digest: bytes
    reserved_gpus: int | None = None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Users:
    """The set of users; ``authenticate`` maps request headers to one of them."""

    def __init__(self, users: list[User]) -> None:
        if not users:
            raise TokensFileError("the tokens file names no user")
        self.users = users

    @classmethod
    def from_data(cls, data: Any, where: str = "tokens") -> Users:
        """Users from the parsed tokens-file content; TokensFileError names what is wrong."""
        if isinstance(data, dict) and "users" in data:
            entries = data["users"]
        elif isinstance(data, dict):
            entries = [{"name": k, "token": v} for k, v in data.items()]
        else:
            raise TokensFileError(f"{where}: expected an object, got {type(data).__name__}")
        if not isinstance(entries, list):
            raise TokensFileError(f"{where}: 'users' must be a list")
        users: list[User] = []
        names: set[str] = set()
        digests: set[bytes] = set()
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise TokensFileError(f"{where}: users[{i}] must be an object")
            name, token = entry.get("name"), entry.get("token")
            if not isinstance(name, str) or not _NAME.match(name):
                raise TokensFileError(f"{where}: users[{i}] has an invalid name {name!r}")
            if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_LENGTH:
                raise TokensFileError(
                    f"{where}: user {name!r} needs a token of at least {MIN_TOKEN_LENGTH} "
                    "characters"
                )
            reserved = entry.get("reserved_gpus")
            if reserved is not None and (not isinstance(reserved, int) or reserved < 0):
                raise TokensFileError(f"{where}: user {name!r}: reserved_gpus must be an int >= 0")
            unknown = set(entry) - {"name", "token", "reserved_gpus"}
            if unknown:
                raise TokensFileError(f"{where}: user {name!r}: unknown field(s) {sorted(unknown)}")
            digest = _digest(token.strip())
            if name in names:
                raise TokensFileError(f"{where}: user {name!r} appears twice")
            if digest in digests:
                raise TokensFileError(f"{where}: user {name!r} shares a token with another user")
            names.add(name)
            digests.add(digest)
            users.append(User(name, digest, reserved))
        return cls(users)

    @classmethod
    def load(cls, path: str | Path) -> Users:
        """Read the tokens file at ``path``."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise TokensFileError(f"tokens file {path} does not exist") from None
        except (OSError, ValueError) as exc:
            raise TokensFileError(f"tokens file {path} is not readable JSON: {exc}") from None
        if path.stat().st_mode & 0o077:
            logger.warning("tokens file %s is readable by other users; chmod 600 it", path)
        return cls.from_data(data, str(path))

    def authenticate(self, authorization: str | None, token_type: str | None = None) -> User:
        """The user whose token is in ``Authorization: Bearer <token>``; AuthError otherwise."""
        if token_type is not None and token_type.strip().upper() != TOKEN_TYPE:
            raise AuthError(f"{TOKEN_TYPE_HEADER} must be {TOKEN_TYPE!r} when given")
        digest = _digest(bearer_token(authorization))
        found: User | None = None
        for user in self.users:  # look at every user so timing does not tell which matched
            if hmac.compare_digest(digest, user.digest):
                found = user
        if found is None:
            raise AuthError(BEARER_REFUSED)
        return found
