"""The platform's request records: each data-plane call runs in a worker pool and is polled.

A record goes ``pending -> running -> done | failed | cancelled`` in the ``Store``; a done
record's result is kept as a frame beside the database (and the latest in memory), and a poll
may wait for the record to end.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from arctic_platform.rl.api import ArcticRLError, decode_frame, encode_frame
from arctic_rl_dss.errors import RequestNotFoundError
from arctic_rl_dss.store import Store

logger = logging.getLogger(__name__)

_RESULT_CACHE = 256
FRAME_RESULT = "arctic-rl-frame"
MAX_POLL_WAIT = 10.0
"""The longest a poll may hold for its request to end (``?wait_s=``)."""


def frame_result(value: Any) -> dict[str, Any]:
    """A result carried as a base64 frame inside poll JSON (tensors, NaN-safe)."""
    return {
        "content_type": "application/octet-stream",
        "encoding": "base64",
        "wire_format": FRAME_RESULT,
        "payload_b64": base64.b64encode(encode_frame(value)).decode(),
    }


class RequestRunner:
    """Runs submitted requests in a thread pool and answers for their records."""

    def __init__(self, store: Store, workers: int = 8) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="platform-req")
        self._futures: dict[str, Future[Any]] = {}
        self._ended: dict[str, threading.Event] = {}
        self._results: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.RLock()

    def close(self) -> None:
        """Stop taking requests; queued ones are cancelled, running ones finish or fail."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def submit(
        self,
        user: str,
        job_id: str,
        operation: str,
        run: Callable[[], Any],
        key: str | None = None,
        fingerprint: str | None = None,
        rerun: bool = False,
    ) -> dict[str, Any]:
        """A new request record running ``run`` in the pool; with a ``key`` already seen, the
        earlier record (``replayed``) and nothing run, unless ``rerun``: then an ended record
        runs ``run`` again in place (the callee's own ledger decides whether to apply)."""
        request_id, replayed = self.store.add_request(user, job_id, operation, key, fingerprint)
        if replayed and rerun and self.store.reopen_request(request_id):
            with self._lock:
                self._results.pop(request_id, None)
            replayed = False
        if not replayed:
            with self._lock:
                self._ended[request_id] = threading.Event()
                self._futures[request_id] = self._pool.submit(self._execute, request_id, run)
        return {"request_id": request_id, "job_id": job_id, "replayed": replayed}

    def _execute(self, request_id: str, run: Callable[[], Any]) -> None:
        try:
            self._run_request(request_id, run)
        finally:
            with self._lock:
                ended = self._ended.pop(request_id, None)
            if ended is not None:
                ended.set()

    def _run_request(self, request_id: str, run: Callable[[], Any]) -> None:
        self.store.set_request(request_id, "running")
        try:
            result = run()
        except ArcticRLError as exc:
            status = getattr(exc, "status_code", None) or exc.status
            self.store.set_request(
                request_id, "failed", error=str(exc), error_code=exc.code, error_status=status
            )
            return
        except Exception as exc:
            logger.exception("request %s failed", request_id)
            self.store.set_request(
                request_id,
                "failed",
                error=f"{type(exc).__name__}: {exc}",
                error_code="internal_error",
                error_status=500,
            )
            return
        finally:
            with self._lock:
                self._futures.pop(request_id, None)
        try:
            path = self.store.result_path(request_id)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(encode_frame(result))
            os.replace(tmp, path)
        except Exception as exc:  # the result stays in memory; a restart would lose it
            logger.warning("cannot keep the result of request %s on disk: %s", request_id, exc)
        with self._lock:
            self._results[request_id] = result
            while len(self._results) > _RESULT_CACHE:
                self._results.popitem(last=False)
        self.store.set_request(request_id, "done", has_result=1)

    def cancel(self, request_id: str) -> bool:
        """Cancel a request that has not started; whether it was."""
        with self._lock:
            future = self._futures.get(request_id)
        if future is not None and future.cancel():
            self.store.set_request(
                request_id, "cancelled", error="cancelled before it ran", error_code="cancelled"
            )
            with self._lock:
                ended = self._ended.pop(request_id, None)
            if ended is not None:
                ended.set()
            return True
        return False

    def result(self, request_id: str) -> Any:
        """A done request's result, from memory or its frame on disk."""
        with self._lock:
            if request_id in self._results:
                return self._results[request_id]
        path = self.store.result_path(request_id)
        if not path.exists():
            raise ArcticRLError(f"the result of request {request_id} is no longer kept")
        return decode_frame(path.read_bytes())

    def view(self, user: str, job_id: str, request_id: str, wait: float = 0.0) -> dict[str, Any]:
        """The record of a request of ``user``'s job; once done its result is a base64 frame.

        With ``wait`` > 0 an unfinished request is waited for up to that many seconds (at
        most ``MAX_POLL_WAIT``), so a poll answers as soon as the work ends.
        """
        record = self.store.request(user, job_id, request_id)
        if record is None:
            raise RequestNotFoundError(f"job {job_id!r} has no request {request_id!r}")
        if wait > 0 and record["status"] in ("pending", "running"):
            with self._lock:
                ended = self._ended.get(request_id)
            if ended is not None and ended.wait(min(wait, MAX_POLL_WAIT)):
                record = self.store.request(user, job_id, request_id) or record
        view = {k: record[k] for k in ("request_id", "job_id", "operation", "status")}
        view.update(created_at=record["created_at"], updated_at=record["updated_at"])
        view.update(result=None, error=record["error"] or "")
        view.update(error_code=record["error_code"], error_status=record["error_status"])
        if record["status"] == "done" and record["has_result"]:
            view["result"] = frame_result(self.result(request_id))
        return view


__all__ = ["FRAME_RESULT", "MAX_POLL_WAIT", "RequestRunner", "frame_result"]
