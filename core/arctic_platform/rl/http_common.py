"""Deprecated: moved to ``arctic_platform.rl.web.common``; this path stays for one release.

Importing it gives the very same module object, so ``arctic_platform.rl.http_common`` and
``arctic_platform.rl.api.http_common`` are ``arctic_platform.rl.web.common``.
"""

from __future__ import annotations

import sys

from arctic_platform.rl.web import common

sys.modules[__name__] = common
