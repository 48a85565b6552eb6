"""How a receiver swaps new weights in while requests are in flight.

``drain`` (the default): no new request starts, the running ones finish under the old
weights, then the weights are swapped and the prefix cache reset. ``hotswap``: the swap
happens between two decode steps with requests still running; the KV cache of those requests
is dropped and recomputed under the new weights, so each of them reports the weight versions
it saw (``weight_version_start``/``_end``, ``weight_version_spans``).
"""

from __future__ import annotations

from arctic_platform.rl.errors import InvalidRequestError

STRATEGIES = ("drain", "hotswap")
IMPLEMENTED = ("drain", "hotswap")
DEFAULT_STRATEGY = "drain"


def check_strategy(name: str) -> str:
    """``name`` if it is an implemented sync strategy; otherwise an InvalidRequestError."""
    if name not in STRATEGIES:
        raise InvalidRequestError(
            f"unknown weight-sync strategy {name!r}; choose one of {', '.join(STRATEGIES)}"
        )
    if name not in IMPLEMENTED:
        raise InvalidRequestError(
            f"weight-sync strategy {name!r} is not implemented yet in this version; use "
            f"one of {', '.join(IMPLEMENTED)}"
        )
    return name
