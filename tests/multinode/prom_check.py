"""Run in the client namespace: poll the Prometheus there until it holds the workers' engine
series of every worker node and the server's request series; print them as ``RESULT``."""

from __future__ import annotations

import json
import sys
import time

import httpx


def nodes(url: str, expr: str) -> list[str]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10, trust_env=False)
    body = answer.json()
    if answer.status_code != 200 or body.get("status") != "success":
        raise SystemExit(f"query {expr!r} failed: {answer.status_code} {body}")
    return sorted(r["metric"].get("NodeAddress", "") for r in body["data"]["result"])


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    url, want, deadline = spec["url"], set(spec["worker_nodes"]), time.monotonic() + spec["timeout"]
    engine = "count by (NodeAddress) (ray_arctic_rl_engine_call_duration_seconds_count)"
    server = "count by (NodeAddress) (ray_arctic_rl_requests_total)"
    while True:
        seen = {"engine_nodes": nodes(url, engine), "server_nodes": nodes(url, server)}
        targets = httpx.get(f"{url}/api/v1/targets", timeout=10, trust_env=False).json()
        seen["targets_up"] = sorted(
            t["labels"]["instance"] for t in targets["data"]["activeTargets"] if t["health"] == "up"
        )
        if want <= set(seen["engine_nodes"]) and seen["server_nodes"]:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(2)
    print("RESULT " + json.dumps(seen))


if __name__ == "__main__":
    main()
