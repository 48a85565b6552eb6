"""Diagnosis of worker and node failures: which of a job's nodes Ray reports dead, on which
node a Ray actor error happened, and a job's failure reason as bounded text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from arctic_platform.rl.server.job_state import Job


def dead_nodes() -> dict[str, dict[str, Any]]:
    """Nodes Ray reports dead, by node id (empty when Ray is not connected)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    try:
        return {str(n.get("NodeID")): n for n in ray.nodes() if not n.get("Alive")}
    except Exception:  # the GCS itself is unreachable: nothing to say about nodes
        return {}


def lost_nodes(job: Job, dead: dict[str, dict[str, Any]]) -> str:
    """Which of ``job``'s worker nodes are dead, as text naming them ('' if none)."""
    lost = []
    for index, node in enumerate(job.nodes):
        info = dead.get(str(node.get("node_id")))
        if info is None:
            continue
        why = info.get("DeathReasonMessage") or "Ray marked it dead"
        lost.append(f"node {node.get('address')} (worker {index}): {why}")
    return "; ".join(dict.fromkeys(lost))


def failure_node(job: Job, workers: list[Any], exc: BaseException) -> str:
    """`` on node ADDRESS`` for the worker a Ray actor error is about ('' if unknown)."""
    actor_id = getattr(exc, "actor_id", None)
    for index, worker in enumerate(workers):
        try:
            if actor_id is not None and worker._actor_id.hex() == actor_id:
                return f" on node {job.node_of(index)}"
        except AttributeError:
            break
    if len(job.nodes) == 1 or len({n.get("address") for n in job.nodes}) == 1:
        return f" on node {job.node_of(0)}"
    return f" (on nodes {job.node_names()})" if job.nodes else ""


def failure_reason(exc: BaseException) -> str:
    """``exc`` as text for a job's reason, its middle cut when it is very long."""
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 20000 else text[:10000] + "\n...\n" + text[-10000:]


__all__ = ["dead_nodes", "failure_node", "failure_reason", "lost_nodes"]
