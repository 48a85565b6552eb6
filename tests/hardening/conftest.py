"""The hardening tests' servers: ``live`` is the session's shared ``arctic-rl serve`` with three
running jobs (``tests/support/live.py``, a fixture of ``tests/conftest.py``); ``platform_live``
is one ``arctic-rl platform serve`` for the platform modules (``platform_server.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

from platform_server import platform_live  # noqa: F401  (package-scoped, shared)

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # the load test drives bench/load.py
    sys.path.insert(0, str(REPO_ROOT))
