"""AsyncArcticRLClient.create cancelled while its thread builds the client (Ctrl-C during
start-up): the client is ended once built, as its ``with`` block would end it, so no server or
job is left that no one holds. A stand-in client class replaces the real one (which would
start a server) so that only the async wrapper is under test."""

from __future__ import annotations

import asyncio
import threading

import pytest

from arctic_platform.rl import client as client_module

EVENTS: list[str] = []


class SlowClient:
    """Takes a while to build, like a client starting a server and its jobs."""

    def __init__(self, config, **kwargs) -> None:
        EVENTS.append("building")
        RELEASE.wait(5)
        EVENTS.append("built")

    def __exit__(self, *exc) -> None:
        EVENTS.append("ended")


RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def slow_client(monkeypatch):
    EVENTS.clear()
    RELEASE.clear()
    monkeypatch.setattr(client_module, "ArcticRLClient", SlowClient)


def test_a_client_built_after_its_caller_was_cancelled_is_ended():
    async def main() -> None:
        task = asyncio.create_task(client_module.AsyncArcticRLClient.create({}))
        while not EVENTS:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        RELEASE.set()  # the thread now finishes building

    asyncio.run(main())  # waits for the executor's thread at the end
    assert EVENTS == ["building", "built", "ended"]


def test_a_client_built_in_time_is_handed_over_and_not_ended():
    RELEASE.set()

    async def main() -> object:
        return await client_module.AsyncArcticRLClient.create({})

    made = asyncio.run(main())
    assert isinstance(made._client, SlowClient)
    assert EVENTS == ["building", "built"]
