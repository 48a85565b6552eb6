"""docs/openapi.json is the document the server serves, and lists every operation."""

from __future__ import annotations

import json
from pathlib import Path

from arctic_platform.rl.wire.operations import OPERATIONS
from arctic_rl_http.openapi import openapi_document

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_checked_in_openapi_matches_the_server():
    checked_in = json.loads(DOC.read_text())
    assert checked_in == json.loads(json.dumps(openapi_document())), (
        "regenerate: python -m arctic_rl_http.openapi > docs/openapi.json"
    )


def test_every_operation_is_documented():
    paths = json.loads(DOC.read_text())["paths"]
    for op in OPERATIONS:
        assert op.method.lower() in paths[op.path], op.name
