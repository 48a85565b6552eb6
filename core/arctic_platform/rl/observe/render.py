"""``arctic-rl dashboard``: the shipped Grafana dashboard's panels drawn from a running
Prometheus into one PNG, for a look at a run where no Grafana runs.

Each panel's queries are asked over the last ``minutes`` (Prometheus's ``query_range``, with
Grafana's ``$__rate_interval`` read as one minute) and drawn as lines, one per series, named
by the query's legend format.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent / "grafana" / "arctic-rl-dashboard.json"
"""The dashboard shipped with the package (import it into Grafana)."""

Fetch = Callable[[str, dict[str, Any]], dict[str, Any]]


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The dashboard's drawable panels in order (rows left out, their nested panels kept)."""
    for panel in dashboard["panels"]:
        if panel.get("type") != "row":
            yield panel
        yield from (p for p in panel.get("panels", []) if p.get("type") != "row")


def promql(expr: str, rate_interval: str = "1m") -> str:
    """A panel query with Grafana's interval variables replaced."""
    for name in ("$__rate_interval", "$__interval"):
        expr = expr.replace(name, rate_interval)
    return expr.replace("$__range", "5m")


def legend(template: str, labels: dict[str, str]) -> str:
    """A series' name from a Grafana legend format (``{{label}}`` replaced)."""
    name = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template or "")
    return name.strip() or ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"


def http_fetch(url: str) -> Fetch:
    """GET a path of the Prometheus at ``url`` (its JSON answer; no proxy)."""
    import urllib.parse
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def fetch(path: str, params: dict[str, Any]) -> dict[str, Any]:
        query = urllib.parse.urlencode(params)
        with opener.open(f"{url.rstrip('/')}{path}?{query}", timeout=30) as answer:
            return dict(json.loads(answer.read()))

    return fetch


def panel_series(
    panel: dict[str, Any], fetch: Fetch, start: float, end: float, step: float
) -> list[tuple[str, list[float], list[float]]]:
    """Every series of a panel's queries over [start, end]: (name, times, values)."""
    out = []
    for target in panel.get("targets", []):
        params = {"query": promql(target["expr"]), "start": start, "end": end, "step": step}
        body = fetch("/api/v1/query_range", params)
        for series in body.get("data", {}).get("result", []):
            points = [(float(t), float(v)) for t, v in series["values"]]
            points = [(t, v) for t, v in points if math.isfinite(v)]
            if points:
                times, values = zip(*points, strict=True)
                name = legend(target.get("legendFormat", ""), series["metric"])
                out.append((name, list(times), list(values)))
    return out


def render(
    fetch: Fetch,
    out: Path,
    *,
    minutes: float = 15.0,
    dashboard: Path = DASHBOARD,
    now: float | None = None,
) -> dict[str, int]:
    """Draw every panel over the last ``minutes`` into ``out``; returns each panel's number
    of series drawn (0: no data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    board = json.loads(Path(dashboard).read_text())
    drawn = list(panels(board))
    end = time.time() if now is None else now
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 240)
    cols = 3
    rows = math.ceil(len(drawn) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.0 * rows), squeeze=False)
    counts: dict[str, int] = {}
    for ax, panel in zip(axes.flat, drawn, strict=False):
        series = panel_series(panel, fetch, start, end, step)
        counts[panel["title"]] = len(series)
        for name, times, values in series[:12]:
            ax.plot([(t - end) / 60 for t in times], values, label=name[:40])
        ax.set_title(panel["title"], fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=6, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.axis("off")
    fig.suptitle(f"{board['title']}: the last {minutes:g} minutes (x: minutes before now)")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return counts


__all__ = ["DASHBOARD", "http_fetch", "legend", "panel_series", "panels", "promql", "render"]
