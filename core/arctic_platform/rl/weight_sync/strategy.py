"""How a receiver swaps new weights in while requests are in flight.

``drain`` (the default): in-flight requests finish first, then the weights are swapped and
the prefix cache reset. ``hotswap`` (swap between decode steps of a running generate) is
named but not implemented yet, and asking for it is a clear error.
"""

from __future__ import annotations

from arctic_platform.rl.errors import InvalidRequestError

STRATEGIES = ("drain", "hotswap")
IMPLEMENTED = ("drain",)
DEFAULT_STRATEGY = "drain"


def check_strategy(name: str) -> str:
    """``name`` if it is an implemented sync strategy; otherwise an InvalidRequestError."""
    if name not in STRATEGIES:
        raise InvalidRequestError(
            f"unknown weight-sync strategy {name!r}; choose one of {', '.join(STRATEGIES)}"
        )
    if name not in IMPLEMENTED:
        raise InvalidRequestError(
            f"weight-sync strategy {name!r} is not implemented yet in this version; use 'drain' "
            "(in-flight requests finish, then the weights are swapped)"
        )
    return name
