"""Deprecated (kept one release): the operation table lives in
``arctic_platform.rl.wire.operations``; import it from there (or ``api``).
"""

from arctic_platform.rl.wire.operations import BY_NAME as BY_NAME
from arctic_platform.rl.wire.operations import OPERATIONS as OPERATIONS
from arctic_platform.rl.wire.operations import Operation as Operation
