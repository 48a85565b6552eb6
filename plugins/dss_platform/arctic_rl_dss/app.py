"""The FastAPI app of the reference platform server: auth, bodies and errors around
``PlatformService``. Every route but ``/health`` and the OpenAPI document needs a user token.
"""

import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from arctic_platform.rl.api import (
    FRAME_CONTENT_TYPE,
    ArcticRLError,
    BodyLimit,
    __version__,
    http_common,
    install_openapi,
)
from arctic_rl_dss.chunks import DEFAULT_CHUNK_BYTES
from arctic_rl_dss.models import (
    TOKEN_TYPE_HEADER,
    Capacity,
    CreateJobRequest,
    ErrorBody,
    LoadBody,
    OperationBody,
    RequestView,
    SaveBody,
    StepBody,
    SubmittedRequest,
)
from arctic_rl_dss.service import PlatformService

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = DEFAULT_CHUNK_BYTES + 4 * 1024 * 1024
"""A chunk of 60 MiB plus its envelope; whole frames above that must be chunked."""
MAX_SUB_JOB_NUMBER = 2**63 - 1
"""Sub-job numbers are SQLite integers; a larger ``?sub_job=`` is a 422, not an overflow."""
CHUNK_ADVICE = "; send frames over 60 MiB as chunks"
json_response = http_common.json_response
error_response = http_common.error_response


_ERRORS: dict[int | str, dict[str, Any]] = {
    "401": {"description": "missing or refused token", "model": ErrorBody},
    "404": {
        "description": "no such job (or not yours), sub-job, request or checkpoint",
        "model": ErrorBody,
    },
    "409": {"description": "the job is not running, or a chunk group conflict", "model": ErrorBody},
    "413": {"description": "body over the size limit (chunk it)", "model": ErrorBody},
    "422": {"description": "invalid request; the message names the field", "model": ErrorBody},
    "429": {
        "description": "over your GPU reservation, or too many unfinished chunk uploads",
        "model": ErrorBody,
    },
}
_FRAME_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            FRAME_CONTENT_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "a safetensors frame, or a chunk envelope of one",
                }
            }
        },
    }
}


def build_app(service: PlatformService, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The platform API over ``service``."""
    app = FastAPI(
        title="Arctic RL platform (dss-platform protocol)",
        generate_unique_id_function=lambda route: str(route.name),
        version=__version__,
        description=(
            "Jobs with typed sub-jobs on a shared cluster. Send 'Authorization: Bearer <token>'"
            f" (and optionally '{TOKEN_TYPE_HEADER}: PROGRAMMATIC_ACCESS_TOKEN'). Control-plane "
            "calls answer at once; data-plane calls answer {request_id, job_id}: poll "
            "GET /{job_id}/requests/{request_id}. See docs/platform-api.md."
        ),
    )

    def user(request: Request) -> str:
        auth = request.headers.get("authorization")
        return service.users.authenticate(auth, request.headers.get(TOKEN_TYPE_HEADER)).name

    User = Annotated[str, Depends(user)]

    async def body_bytes(request: Request) -> bytes:
        return await http_common.read_body(request, max_body_bytes, CHUNK_ADVICE)

    Frame = Annotated[bytes, Depends(body_bytes)]

    def accepted(path: str, **extra: Any) -> Any:
        """A data-plane POST route answering 202 ``{request_id, job_id}``."""
        return app.post(
            path,
            tags=["data"],
            responses=_ERRORS,
            status_code=202,
            response_model=SubmittedRequest,
            **extra,
        )

    @app.exception_handler(ArcticRLError)
    async def arctic_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ArcticRLError)
        if exc.status >= 500:
            logger.error("request failed: %s", exc)
        return error_response(exc.status, str(exc), exc.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        parts = http_common.error_parts(errors)
        detail = [{k: e.get(k) for k in ("loc", "msg", "type")} for e in errors]
        return error_response(422, "; ".join(parts), "invalid_request", detail=detail)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc.__cause__, ArcticRLError):  # raised while FastAPI read the body
            return error_response(exc.__cause__.status, str(exc.__cause__), exc.__cause__.code)
        if exc.status_code == 400:  # FastAPI: a body that cannot be parsed (not UTF-8 JSON)
            return error_response(422, f"invalid body: {exc.detail}", "invalid_request")
        code = http_common.http_error_code(exc.status_code)
        return error_response(exc.status_code, str(exc.detail), code)

    @app.get("/health", tags=["service"], summary="liveness (no token)")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": __version__}

    @app.get("/capacity", tags=["control"], responses=_ERRORS, response_model=Capacity)
    def capacity(who: User) -> Response:
        """Your reservation, the GPUs your jobs use, and how many you could still get."""
        return json_response(service.capacity(who))

    @app.get("/metrics", tags=["control"], responses=_ERRORS)
    def metrics(who: User) -> Response:
        """Your own counts: requests, failures and seconds per operation; sub-jobs per state."""
        return json_response(service.metrics(who))

    @app.post("/", tags=["control"], responses=_ERRORS, status_code=201)
    def create_job(who: User, body: CreateJobRequest) -> Response:
        """Create a job. Give ``job_id`` to make a retry safe: a second create is a 409."""
        return json_response(service.create_job(who, body), 201)

    @app.get("/", tags=["control"], responses=_ERRORS)
    def list_jobs(
        who: User,
        status: Annotated[str | None, Query(max_length=40)] = None,
        sub_job: Annotated[int | None, Query(ge=0, le=MAX_SUB_JOB_NUMBER)] = None,
    ) -> Response:
        """Your jobs: all, those in ``status``, or the one holding sub-job ``sub_job``."""
        return json_response(service.list_jobs(who, status, sub_job))

    @app.get("/{job_id}", tags=["control"], responses=_ERRORS)
    def get_job(who: User, job_id: str) -> Response:
        """A job and its sub-jobs with their states."""
        return json_response(service.get_job(who, job_id))

    @app.post("/{job_id}:cancel", tags=["control"], responses=_ERRORS)
    def cancel_job(who: User, job_id: str) -> Response:
        """Cancel a job; repeating it is a success, a job that ended on its own is a 409."""
        return json_response(service.cancel(who, job_id))

    @app.get("/{job_id}/checkpoints", tags=["checkpoints"], responses=_ERRORS)
    def list_checkpoints(who: User, job_id: str) -> Response:
        """The job's checkpoints."""
        return json_response(service.list_checkpoints(who, job_id))

    @app.post(
        "/{job_id}/checkpoints/{checkpoint_id}:export", tags=["checkpoints"], responses=_ERRORS
    )
    def export_checkpoint(who: User, job_id: str, checkpoint_id: str) -> Response:
        """Links (on this server, same token) to every file of a checkpoint."""
        return json_response(service.export_checkpoint(who, job_id, checkpoint_id))

    @app.get(
        "/{job_id}/checkpoints/{checkpoint_id}/files/{name:path}",
        tags=["checkpoints"],
        responses=_ERRORS,
        response_class=FileResponse,
    )
    def checkpoint_file(who: User, job_id: str, checkpoint_id: str, name: str) -> FileResponse:
        """One file of a checkpoint."""
        return FileResponse(service.checkpoint_file(who, job_id, checkpoint_id, name))

    @app.delete(
        "/{job_id}/checkpoints/{checkpoint_id}",
        tags=["checkpoints"],
        responses=_ERRORS,
        status_code=204,
    )
    def delete_checkpoint(who: User, job_id: str, checkpoint_id: str) -> Response:
        """Delete a checkpoint (404 if there is none)."""
        service.delete_checkpoint(who, job_id, checkpoint_id)
        return Response(status_code=204)

    @accepted("/{job_id}/forward-backward", openapi_extra=_FRAME_BODY)
    async def forward_backward(who: User, job_id: str, body: Frame) -> Response:
        """One chunk envelope of a forward-backward frame; the last chunk schedules it.

        The chunk group id is the idempotency key: the gradient is applied at most once.
        """
        return json_response(
            await run_in_threadpool(service.forward_backward, who, job_id, body), 202
        )

    @accepted("/{job_id}/step")
    def step(who: User, job_id: str, body: StepBody) -> Response:
        """Schedule an optimizer step."""
        return json_response(service.step(who, job_id, body), 202)

    @accepted("/{job_id}/save")
    def save(who: User, job_id: str, body: SaveBody) -> Response:
        """Schedule a checkpoint of the training sub-job."""
        return json_response(service.save(who, job_id, body), 202)

    @accepted("/{job_id}/load")
    def load(who: User, job_id: str, body: LoadBody) -> Response:
        """Schedule loading one of the job's checkpoints into its training sub-job."""
        return json_response(service.load(who, job_id, body), 202)

    @accepted("/{job_id}/generate", openapi_extra=_FRAME_BODY)
    async def generate(who: User, job_id: str, body: Frame) -> Response:
        """Schedule generation: a frame of {prompts, sampling_params}, chunked when large."""
        return json_response(await run_in_threadpool(service.generate, who, job_id, body), 202)

    @app.post(
        "/{job_id}/operation",
        tags=["data"],
        responses={
            **_ERRORS,
            "202": {
                "description": "an asynchronous operation was accepted: poll its request_id",
                "model": SubmittedRequest,
            },
        },
    )
    def operation(who: User, job_id: str, body: OperationBody) -> Response:
        """A generic operation: async ones answer {request_id}, inline ones {result}."""
        answer = service.operation(who, job_id, body)
        return json_response(answer, 202 if "request_id" in answer else 200)

    @app.get("/{job_id}/requests", tags=["data"], responses=_ERRORS)
    def list_requests(who: User, job_id: str) -> Response:
        """The job's request records with their states (newest first)."""
        return json_response(service.list_requests(who, job_id))

    @app.get(
        "/{job_id}/requests/{request_id}",
        tags=["data"],
        responses=_ERRORS,
        response_model=RequestView,
    )
    def get_request(
        who: User,
        job_id: str,
        request_id: str,
        wait_s: Annotated[float, Query(ge=0, le=60)] = 0.0,
    ) -> Response:
        """A request record: pending, running, done (with its result), failed or cancelled.

        ``wait_s`` holds an unfinished request's poll for up to that long (at most 10 s), so
        the answer comes as soon as the work ends.
        """
        return json_response(service.get_request(who, job_id, request_id, wait_s))

    install_openapi(app, _declare_security)
    app.add_middleware(BodyLimit, limit=max_body_bytes, advice=CHUNK_ADVICE)
    return app


def _declare_security(schema: dict[str, Any]) -> None:
    """Declare the bearer token in the OpenAPI document: every route but /health needs it."""
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a user's personal access token from the server's --tokens file",
    }
    for path, methods in schema["paths"].items():
        for operation in methods.values():
            operation["security"] = [] if path == "/health" else [{"bearer": []}]


__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyLimit", "build_app", "error_response", "json_response"]
