"""The web kit's server skeleton: real uvicorn on 127.0.0.1, stopped by an event or SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from arctic_platform.rl.errors import ArcticRLError, ServeError
from arctic_platform.rl.network import LOOPBACK, free_port
from arctic_platform.rl.web.serve import (
    check_serve_token,
    serve_http,
    server_socket,
    stop_on_signals,
)


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def _wait_for(url: str, seconds: float = 15.0) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return httpx.get(url, timeout=1)
        except httpx.HTTPError:
            assert time.monotonic() < deadline, f"nothing answered on {url}"
            time.sleep(0.02)


def test_serve_http_answers_until_the_stop_event_then_frees_its_port():
    port, stop, errors = free_port(), threading.Event(), []

    def run() -> None:
        try:
            serve_http(_hello, LOOPBACK, port, stop=stop, log_level="warning")
        except BaseException as exc:  # surfaced through errors
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    answer = _wait_for(f"http://{LOOPBACK}:{port}/")
    assert (answer.status_code, answer.text) == (200, "hello")
    assert "server" not in answer.headers  # no Server header
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and errors == []
    server_socket(LOOPBACK, port).close()  # the socket was closed: the port binds again


def test_an_address_in_use_is_a_serve_error_naming_it():
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ServeError, match=f"cannot listen on {LOOPBACK}:{port}"):
            serve_http(_hello, LOOPBACK, port, stop=threading.Event())


def test_the_token_rule_refuses_no_token_off_loopback_and_an_empty_token():
    with pytest.raises(ServeError, match=r"non-loopback address 0\.0\.0\.0 without a token"):
        check_serve_token("0.0.0.0", None)
    with pytest.raises(ServeError, match="empty"):
        check_serve_token(LOOPBACK, "  ")
    check_serve_token(LOOPBACK, None)
    check_serve_token("0.0.0.0", "a-token")
    assert issubclass(ServeError, ArcticRLError)


def test_sigterm_and_sigint_set_the_stop_event():
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for signum in previous:
            stop = threading.Event()
            stop_on_signals(stop)
            os.kill(os.getpid(), signum)
            assert stop.wait(5), signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


SERVE_UNTIL_SIGTERM = """
import sys, threading
from arctic_platform.rl.web.serve import serve_http, stop_on_signals

async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"up"})

stop = threading.Event()
stop_on_signals(stop)
serve_http(app, "127.0.0.1", int(sys.argv[1]), stop=stop, log_level="warning")
print("stopped in order", flush=True)
"""


def test_a_sigterm_stops_a_serving_process_in_order_and_it_exits_0():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_UNTIL_SIGTERM, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert _wait_for(f"http://{LOOPBACK}:{port}/", 30).text == "up"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    assert "stopped in order" in output
