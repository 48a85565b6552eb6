"""The FastAPI app of the ``tinker`` transport: the REST surface of the ``tinker==0.38.0`` SDK.

Routes parse the body (JSON, or protobuf for forward_backward), check the ``X-API-Key``
header in constant time and hand the work to ``TinkerFrontend``; results are polled with
``retrieve_future`` (a long poll that answers ``try_again`` while the work runs). Errors
answer ``{"error", "category"}`` with a 4xx/5xx status; the key is never logged or echoed.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from arctic_platform.rl.api import (
    ArcticRLError,
    BadRequestError,
    BodyLimit,
    ByteCounter,
    GuardLayer,
    InvalidRequestError,
    TokenGuard,
    __version__,
    http_common,
)
from arctic_rl_tinker.frontend import TinkerFrontend, UnknownIdError
from arctic_rl_tinker.futures import Future

logger = logging.getLogger(__name__)

PROTO = "application/x-protobuf"
MAX_BODY_BYTES = 256 * 1024 * 1024
POLL_SECONDS = 20.0
"""How long one retrieve_future waits for its result before answering ``try_again``."""
OPEN_PATHS = frozenset({"/api/v1/healthz"})

CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "parallel_fwdbwd_chunks": True,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "use_pyqwest_transport": True,
}
"""The feature flags this server answers to ``/api/v1/client/config``."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSession(_Body):
    """``create_session``: tags, metadata and SDK version are accepted and not kept."""

    sdk_version: str | None = None


class SessionRef(_Body):
    """A request naming a session."""

    session_id: str = Field(min_length=1)


class LoraConfig(_Body):
    """Tinker's LoRA settings: the rank, the init seed and which parts get adapters (the rank
    limit and the targets are checked by ``lora_models.lora_section``)."""

    rank: int = Field(ge=1)
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


class OptimizerConfig(_Body):
    """The optimizer family fixed at model creation: only ``adamw``."""

    type: str = "adamw"


class CreateModel(SessionRef):
    """``create_model``: a training model on ``base_model``."""

    model_seq_id: int = Field(ge=0)
    base_model: str = Field(min_length=1)
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig)


class ModelRef(_Body):
    """A request naming a model, with its place in the model's order."""

    model_id: str = Field(min_length=1)
    seq_id: int | None = Field(default=None, ge=0)


class AdamParams(_Body):
    """Tinker's AdamParams."""

    type: str | None = None
    learning_rate: float = Field(default=1e-4, gt=0, allow_inf_nan=False)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-12, gt=0, allow_inf_nan=False)
    weight_decay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    grad_clip_norm: float = Field(default=0.0, allow_inf_nan=False)


class OptimStep(ModelRef):
    """``optim_step``: one optimizer step with these AdamParams."""

    adam_params: AdamParams | None = None
    optimizer_params: dict[str, Any] | None = None


class SaveWeights(ModelRef):
    """``save_weights`` / ``save_weights_for_sampler``: ``path`` is a name."""

    path: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")


class LoadWeights(_Body):
    """``load_weights`` onto an existing model."""

    model_id: str | None = None
    seq_id: int | None = Field(default=None, ge=0)
    session_id: str | None = None
    path: str = Field(min_length=1)
    optimizer: bool = True


class CreateSampler(SessionRef):
    """``create_sampling_session`` on a sampler path or a base model."""

    model_path: str | None = None
    base_model: str | None = None


class Sample(_Body):
    """``asample``: the fields mapped (the rest are checked in the frontend)."""

    sampling_session_id: str | None = None
    seq_id: int | None = None
    num_samples: int = Field(default=1, ge=1, le=128)
    prompt: dict[str, Any]
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    model_path: str | None = None
    base_model: str | None = None
    prompt_logprobs: bool | None = None
    prompt_logprobs_last_n: int | None = Field(default=None, ge=1)
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: Any = None
    prompt_alt_tokens_k: int = 0


class Retrieve(_Body):
    """``retrieve_future``."""

    request_id: str = Field(min_length=1)


_json = http_common.json_response  # the shared JSON answer (non-finite floats as NaN tokens)


def _error(status: int, message: str, category: str = "user") -> Response:
    return _json({"error": message, "category": category}, status)


def _parse(model: type[_Body], raw: bytes) -> Any:
    """The body as ``model``: the shared JSON read, and a 400 (not 422) when it does not fit."""
    data = http_common.read_json_body(raw or b"{}")
    if not isinstance(data, dict):
        raise BadRequestError("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        parts = http_common.error_parts(exc.errors())
        raise BadRequestError(f"invalid {model.__name__} request: " + "; ".join(parts)) from None


ORDERED_PATHS = frozenset(
    {
        "/api/v1/optim_step",
        "/api/v1/save_weights_for_sampler",
        "/api/v1/save_weights",
        "/api/v1/load_weights",
    }
)
"""JSON routes whose requests take a place in their model's ``seq_id`` order."""


def _refuse(frontend: TinkerFrontend, raw: bytes) -> None:
    """Free the ``seq_id`` of a refused JSON request, if the body names one."""
    try:
        data = json.loads(raw)
        model_id, seq_id = data.get("model_id"), data.get("seq_id")
    except (ValueError, AttributeError):
        return
    if isinstance(model_id, str) and isinstance(seq_id, int) and not isinstance(seq_id, bool):
        frontend.refuse(model_id, seq_id)


def _accepted(future: Future, **extra: Any) -> Response:
    return _json({"request_id": future.request_id, **extra})


def _refusal(exc: ArcticRLError) -> Response:
    """A guard's refusal (401 key, 413 body) as a Tinker error body."""
    return _error(exc.status, str(exc))


def build_app(frontend: TinkerFrontend, token: str | None) -> FastAPI:
    """The Tinker REST app over ``frontend``; ``token`` None disables the key check."""
    app = FastAPI(title="Arctic RL: Tinker API", version=__version__, docs_url=None)
    key = TokenGuard(
        token,
        header="x-api-key",
        open_paths=OPEN_PATHS,
        missing="missing X-API-Key header (set TINKER_API_KEY)",
        refused="the API key was refused",
    )
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES, respond=_refusal)
    app.add_middleware(GuardLayer, guard=key, respond=_refusal)
    app.add_middleware(ByteCounter, api="tinker")  # outermost: refusals are counted too

    def route(path: str, method: str = "POST") -> Any:
        def wrap(handler: Any) -> Any:
            async def endpoint(request: Request) -> Response:
                try:
                    return await handler(request)  # type: ignore[no-any-return]
                except ArcticRLError as exc:
                    if path in ORDERED_PATHS:  # its seq_id is used: later requests may run
                        _refuse(frontend, await request.body())
                    status = getattr(exc, "status", 400)
                    if status >= 500:
                        logger.error("%s failed: %s", path, exc)
                    return _error(status, str(exc), "user" if status < 500 else "server")
                except Exception as exc:
                    logger.exception("%s failed unexpectedly", path)
                    return _error(500, f"{type(exc).__name__}: {exc}", "server")

            app.add_api_route(path, endpoint, methods=[method], name=path.rsplit("/", 1)[-1])
            return handler

        return wrap

    @route("/api/v1/healthz", "GET")
    async def healthz(_: Request) -> Response:
        return _json({"status": "ok"})

    @route("/api/v1/client/config")
    async def client_config(_: Request) -> Response:
        return _json(CLIENT_CONFIG)

    @route("/api/v1/client/dynamic_config")
    async def dynamic_config(_: Request) -> Response:
        return _json({"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    @route("/api/v1/get_server_capabilities", "GET")
    async def capabilities(_: Request) -> Response:
        return _json({"supported_models": []})

    @route("/api/v1/telemetry")
    async def telemetry(_: Request) -> Response:
        return _json({"status": "accepted"})

    @route("/api/v1/create_session")
    async def create_session(request: Request) -> Response:
        _parse(CreateSession, await request.body())
        return _json({"type": "create_session", "session_id": frontend.create_session()})

    @route("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> Response:
        body = _parse(SessionRef, await request.body())
        frontend.heartbeat(body.session_id)
        return _json({"type": "session_heartbeat"})

    @route("/api/v1/sessions/{session_id}/finish")
    async def finish(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        frontend.session(session_id)
        await run_in_threadpool(frontend.finish_session, session_id)
        return _json(None)

    @route("/api/v1/create_model")
    async def create_model(request: Request) -> Response:
        body = _parse(CreateModel, await request.body())
        if body.optimizer_config.type != "adamw":
            raise InvalidRequestError(
                f"optimizer {body.optimizer_config.type!r} is not offered; only 'adamw'"
            )
        lora = body.lora_config.model_dump() if body.lora_config else None
        future = frontend.create_model(body.session_id, body.model_seq_id, body.base_model, lora)
        return _accepted(future)

    @route("/api/v1/get_info")
    async def get_info(request: Request) -> Response:
        body = _parse(ModelRef, await request.body())
        return _json(frontend.get_info(body.model_id))

    @route("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> Response:
        raw = await request.body()
        if request.headers.get("content-encoding", "").lower() == "zstd":
            import zstandard

            try:
                raw = zstandard.ZstdDecompressor().decompress(raw)
            except zstandard.ZstdError as exc:
                raise BadRequestError(f"the zstd body cannot be decompressed: {exc}") from None
        future = await run_in_threadpool(frontend.forward_backward, raw)
        return _accepted(future)

    @route("/api/v1/optim_step")
    async def optim_step(request: Request) -> Response:
        body = _parse(OptimStep, await request.body())
        if body.adam_params is None:
            raise InvalidRequestError("optim_step needs adam_params (only AdamW is offered)")
        adam = body.adam_params.model_dump(exclude={"type"})
        return _accepted(frontend.optim_step(body.model_id, body.seq_id, adam))

    @route("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> Response:
        body = _parse(SaveWeights, await request.body())
        return _accepted(frontend.save_weights_for_sampler(body.model_id, body.seq_id, body.path))

    @route("/api/v1/save_weights")
    async def save_weights(request: Request) -> Response:
        body = _parse(SaveWeights, await request.body())
        return _accepted(frontend.save_weights(body.model_id, body.seq_id, body.path))

    @route("/api/v1/load_weights")
    async def load_weights(request: Request) -> Response:
        body = _parse(LoadWeights, await request.body())
        if body.model_id is None:
            raise InvalidRequestError(
                "creating a model by load_weights is not offered; create_model, then load_state"
            )
        future = frontend.load_weights(body.model_id, body.seq_id, body.path, body.optimizer)
        return _accepted(future)

    @route("/api/v1/create_sampling_session")
    async def create_sampler(request: Request) -> Response:
        body = _parse(CreateSampler, await request.body())
        sampler_id = await run_in_threadpool(
            frontend.create_sampling_session, body.session_id, body.model_path, body.base_model
        )
        return _json({"type": "create_sampling_session", "sampling_session_id": sampler_id})

    @route("/api/v1/samplers/{sampler_id}", "GET")
    async def get_sampler(request: Request) -> Response:
        sampler = frontend.sampler(request.path_params["sampler_id"])
        return _json(
            {
                "sampler_id": sampler.sampler_id,
                "base_model": sampler.base_model,
                "model_path": sampler.model_path,
            }
        )

    @route("/api/v1/asample")
    async def asample(request: Request) -> Response:
        body = _parse(Sample, await request.body())
        if body.sampling_session_id is None:
            raise InvalidRequestError("asample needs a sampling_session_id")
        sampler = frontend.sampler(body.sampling_session_id)
        future = frontend.sample(sampler, body.model_dump())
        ids = [f"{future.request_id}:{i}" for i in range(body.num_samples)]
        return _accepted(future, sample_sequence_ids=ids)

    @route("/api/v1/retrieve_future")
    async def retrieve(request: Request) -> Response:
        body = _parse(Retrieve, await request.body())
        future = frontend.futures.get(body.request_id)
        if future is None:
            raise UnknownIdError(f"unknown request_id {body.request_id!r}")
        outcome = await future.wait(POLL_SECONDS)
        if outcome is None:
            return _json(
                {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
            )
        if outcome.error is not None:
            return _json({"error": outcome.error, "category": outcome.category})
        if outcome.proto is not None:
            return Response(outcome.proto, media_type=PROTO)
        return _json(outcome.json)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _error(exc.status_code, str(exc.detail))

    async def invalid(_: Request, exc: Exception) -> Response:
        return _error(400, str(exc))

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    return app


__all__ = ["build_app"]
