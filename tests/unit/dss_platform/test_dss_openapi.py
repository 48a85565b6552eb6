"""docs/platform-openapi.json is the document the platform server serves."""

from __future__ import annotations

import json
from pathlib import Path

from arctic_rl_dss.openapi import openapi_document

DOC = Path(__file__).resolve().parents[3] / "docs" / "platform-openapi.json"


def test_the_checked_in_document_matches_the_server():
    assert json.loads(DOC.read_text()) == json.loads(json.dumps(openapi_document())), (
        "regenerate: python -m arctic_rl_dss.openapi > docs/platform-openapi.json"
    )


def test_every_protocol_route_is_documented_and_needs_the_token_but_health():
    paths = json.loads(DOC.read_text())["paths"]
    expected = {
        ("/", "post"),
        ("/", "get"),
        ("/capacity", "get"),
        ("/{job_id}", "get"),
        ("/{job_id}:cancel", "post"),
        ("/{job_id}/checkpoints", "get"),
        ("/{job_id}/checkpoints/{checkpoint_id}:export", "post"),
        ("/{job_id}/checkpoints/{checkpoint_id}", "delete"),
        ("/{job_id}/forward-backward", "post"),
        ("/{job_id}/step", "post"),
        ("/{job_id}/save", "post"),
        ("/{job_id}/load", "post"),
        ("/{job_id}/generate", "post"),
        ("/{job_id}/operation", "post"),
        ("/{job_id}/requests/{request_id}", "get"),
    }
    documented = {(p, m) for p, ms in paths.items() for m in ms}
    assert expected <= documented
    for path, methods in paths.items():
        for op in methods.values():
            assert op["security"] == ([] if path == "/health" else [{"bearer": []}]), path
            if path != "/health":
                assert "401" in op["responses"], path
