"""ASGI middleware that counts the bytes of HTTP request and response bodies for the
``arctic_rl_http_bytes_total`` metric (``observe``), labelled with the API it serves."""

from __future__ import annotations

from typing import Any

from arctic_platform.rl.observe.recorder import RECORDER
from arctic_platform.rl.observe.server_metrics import record_http_bytes


class ByteCounter:
    """Count each HTTP exchange's body bytes in and out under ``api`` (arctic_rl, tinker, ...)."""

    def __init__(self, app: Any, api: str) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not RECORDER.active():
            await self.app(scope, receive, send)
            return
        received = sent = 0

        async def counted_receive() -> Any:
            nonlocal received
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
            return message

        async def counted_send(message: Any) -> None:
            nonlocal sent
            if message.get("type") == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            record_http_bytes(self.api, received, sent)


__all__ = ["ByteCounter"]
