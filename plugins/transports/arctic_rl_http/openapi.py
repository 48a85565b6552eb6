"""``python -m arctic_rl_http.openapi``: print the OpenAPI document (docs/openapi.json)."""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the server serves at /openapi.json (no Ray, no jobs needed)."""
    from arctic_platform.rl.api import RLServer
    from arctic_rl_http.app import build_app

    with tempfile.TemporaryDirectory() as run_dir:
        return build_app(RLServer(run_dir), token="unused").openapi()


if __name__ == "__main__":
    json.dump(openapi_document(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
