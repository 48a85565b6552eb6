"""Error types of Arctic RL: every failure a user can act on is one of these."""

from __future__ import annotations


class ArcticRLError(Exception):
    """Base class of every error Arctic RL raises on purpose."""


class PluginError(ArcticRLError):
    """A plugin could not be loaded, resolved or used."""


class UnknownPluginError(PluginError, ValueError):
    """A configured name matches no installed plugin of that kind."""


class DuplicatePluginError(PluginError):
    """Two plugins register the same name for the same kind."""


class NotImplementedInThisVersion(ArcticRLError, NotImplementedError):
    """A registered component whose implementation has not been built yet."""


class JobError(ArcticRLError):
    """A job failed, is in the wrong state, or does not exist."""


class TransportError(ArcticRLError):
    """The client could not reach the server or got an unusable answer."""


class ServerError(TransportError):
    """The server answered a request with an error status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
