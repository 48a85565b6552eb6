"""OpenAI's error answer, checked whole: what every refused agent-session request must send
(``{"error": {"message", "type", "param", "code"}}``, the type matching the status)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
}
"""The ``type`` OpenAI's API gives each status its clients read."""


def openai_error(response: Any, status: int) -> dict[str, Any]:
    """The inner ``error`` of an HTTP ``response`` (httpx) after checking its status and
    its whole shape: exactly message, type, param and code; a message that says something."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert error["type"] == ERROR_TYPES[status], error
    return dict(error)


def refused(call: Callable[[], Any], status: int = 400, match: str | None = None) -> dict[str, Any]:
    """Run ``call`` (an ``openai`` client request) expecting OpenAI's error of ``status``;
    returns the error after checking its whole shape (and that ``match`` is in its message)."""
    import openai

    with pytest.raises(openai.APIStatusError) as caught:
        call()
    error = openai_error(caught.value.response, status)
    if match is not None:
        assert match in error["message"], error["message"]
    return error
