"""Deprecated (kept one release): the frame codec lives in ``arctic_platform.rl.wire.frames``
and the batch names in ``arctic_platform.rl.batch``; import them from there (or ``api``).
"""

from arctic_platform.rl.batch import BATCH_FIELDS as BATCH_FIELDS
from arctic_platform.rl.batch import PER_TOKEN_FIELDS as PER_TOKEN_FIELDS
from arctic_platform.rl.batch import BatchError as BatchError
from arctic_platform.rl.wire.frames import FRAME_CONTENT_TYPE as FRAME_CONTENT_TYPE
from arctic_platform.rl.wire.frames import MAX_NESTING as MAX_NESTING
from arctic_platform.rl.wire.frames import FrameError as FrameError
from arctic_platform.rl.wire.frames import decode_frame as decode_frame
from arctic_platform.rl.wire.frames import encode_frame as encode_frame
from arctic_platform.rl.wire.frames import validate_batch as validate_batch
