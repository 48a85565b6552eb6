"""Run server operations from inside a host of the namespace cluster; print one JSON line.

``python client_ops.py SPEC.json`` where SPEC holds ``host``, ``port``, ``token`` and ``ops``
(a list of ``[operation, payload]``). Each op answers ``{"ok": true, "result": ...}`` or
``{"ok": false, "status": ..., "code": ..., "message": ...}``, with the seconds it took.
"""

from __future__ import annotations

import json
import sys
import time


def main(spec_path: str) -> None:
    """Run the ops of the spec file in order and print ``RESULT <json list>``."""
    from arctic_platform.rl.errors import ServerError, TransportError
    from arctic_rl_http.client import HttpTransport

    spec = json.loads(open(spec_path).read())
    transport = HttpTransport(spec["host"], spec["port"], spec["token"], retries=0)
    answers = []
    for name, payload in spec["ops"]:
        started = time.monotonic()
        try:
            answer = {"ok": True, "result": transport.call(name, payload)}
        except ServerError as exc:
            answer = {
                "ok": False,
                "status": exc.status_code,
                "code": exc.code,
                "message": exc.message,
            }
        except TransportError as exc:
            answer = {"ok": False, "status": None, "code": exc.code, "message": str(exc)}
        answer["seconds"] = time.monotonic() - started
        answers.append(answer)
    transport.close()
    print("RESULT " + json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1])
