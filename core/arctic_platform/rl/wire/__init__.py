"""What travels between client and server: request models (``requests``), the operation
table (``operations``) and the safetensors frame codec (``frames``).

``from arctic_platform.rl.wire import FwdBwdRequest`` keeps working: this package face
re-exports every public name of the three (each module's ``__all__``).
"""

from arctic_platform.rl.wire import frames, operations, requests
from arctic_platform.rl.wire.frames import *  # noqa: F403
from arctic_platform.rl.wire.operations import *  # noqa: F403
from arctic_platform.rl.wire.requests import *  # noqa: F403

__all__ = [*requests.__all__, *operations.__all__, *frames.__all__]
