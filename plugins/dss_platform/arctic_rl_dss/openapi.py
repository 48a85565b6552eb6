"""The platform API's OpenAPI document.

Regenerate the checked-in copy:
``python -m arctic_rl_dss.openapi > docs/platform-openapi.json``.
"""

from __future__ import annotations

import json
from typing import Any


def openapi_document() -> dict[str, Any]:
    """The document the platform server serves at ``/openapi.json``."""
    from arctic_rl_dss.app import build_app

    return build_app(None).openapi()  # type: ignore[arg-type]  # routes only; no service needed


if __name__ == "__main__":
    print(json.dumps(openapi_document(), indent=2, sort_keys=True))
