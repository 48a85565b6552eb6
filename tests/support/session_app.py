"""Agent sessions without an engine, for unit tests: ``FakeServer`` holds a real
``AgentOps`` over one fake sampling job whose ``generate`` answers fixed ids (or what a
test's ``reply`` function makes of the prompt), and the http app over it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from arctic_platform.rl.server.agent_ops import AgentOps
from arctic_platform.rl.server.job_state import Job
from arctic_platform.rl.wire.operations import BY_NAME

TOKEN = "server-token-0123456789"


class FakeJobs:
    """One sampling job (id 1) of the tokenizer's directory; ``weight_version`` settable."""

    def __init__(self, model: str) -> None:
        self.job = Job(job_id=1, job_type="sampling", engine="vllm", config={}, num_gpus=1)
        self.job.config = {"model_name": model, "vllm_config": {"max_model_len": 1024}}

    def get(self, job_id: int) -> Job:
        from arctic_platform.rl.errors import JobNotFoundError

        if job_id != 1:
            raise JobNotFoundError(f"no job {job_id}")
        return self.job


class FakeServer:
    """What the http app needs of an ``RLServer``: ``handle`` and ``agents``."""

    def __init__(
        self,
        model: str,
        replies: list[list[int]],
        reply: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        self.jobs = FakeJobs(model)
        self.replies = replies
        self.reply = reply
        self.requests: list[Any] = []
        self.agents = AgentOps(self.jobs, self.generate)
        self.shutdown_requested = threading.Event()

    def generate(self, request: Any) -> dict[str, Any]:
        self.requests.append(request)
        version = self.jobs.job.weight_version
        completions = []
        for _ in range(int(request.sampling_params.get("n") or 1)):
            if self.reply is not None:
                ids = self.reply(list(request.prompts[0]))
            else:
                ids = self.replies.pop(0) if self.replies else [3]
            completions.append(
                {
                    "token_ids": ids,
                    "logprobs": [-0.5] * len(ids),
                    "finish_reason": "stop",
                    "weight_version_start": version,
                    "weight_version_end": version,
                    "top_logprobs": [[[i, -0.5], [0, -2.0]] for i in ids],
                }
            )
        return {"outputs": [{"completions": completions}], "weight_version": version}

    def handle(self, name: str, payload: dict[str, Any] | None) -> Any:
        request = BY_NAME[name].request.model_validate(payload or {})
        return getattr(self.agents, name)(request)


def http_app(server: FakeServer, token: str | None) -> Any:
    """A ``TestClient`` of the http transport's app over ``server``."""
    from fastapi.testclient import TestClient

    from arctic_rl_http.app import build_app

    return TestClient(build_app(server, token))  # type: ignore[arg-type]


def open_session(http: Any, token: str | None = TOKEN) -> dict[str, Any]:
    """A new session on job 1 through the app: the ``open_session`` answer."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = http.post("/sessions", json={"job_id": 1, "ttl": 60}, headers=headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def openai_client(http: Any, base: str, key: str) -> Any:
    """The real ``openai`` client on a session's routes, through the app's test client."""
    import openai

    return openai.OpenAI(
        base_url=f"http://testserver{base}", api_key=key, http_client=http, max_retries=0
    )
