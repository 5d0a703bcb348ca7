"""Sweep report: the best cluster per model and metric, the throughput-vs-devices (or price) Pareto front,
and its plot. Only successful rows count; ties break by fewer devices, then by the cluster spec.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from hapmoe_milp.errors import HapmoeError

log = logging.getLogger(__name__)

XAxis = Literal["devices", "price"]


# ---------------------------------------------------------------------- analysis
def ok_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r) for r in rows if r.get("status") == "ok" and r.get("tokens_per_s")]


def _label(r: Mapping[str, Any]) -> str:
    c = r.get("cluster") or {}
    return str(c.get("spec") or c.get("name") or "?")


def _devices(r: Mapping[str, Any]) -> int:
    c = r.get("cluster") or {}
    return int(r.get("devices") or c.get("devices") or 0)


METRICS: tuple[tuple[str, str], ...] = (
    ("tokens_per_s", "throughput (tokens/s)"),
    ("tokens_per_s_per_device", "tokens/s per device"),
    ("tokens_per_dollar", "tokens per dollar"),
)


def best_table(rows: Iterable[Mapping[str, Any]], top: int = 1) -> list[dict[str, Any]]:
    """Best ``top`` clusters per model for each metric; tokens per dollar only where prices are known.

    Ties break by fewer devices, then by the cluster spec, so the table is deterministic.
    """
    good = ok_rows(rows)
    out: list[dict[str, Any]] = []
    for model in sorted({r["model"] for r in good}):
        mine = [r for r in good if r["model"] == model]
        for key, label in METRICS:
            have = [r for r in mine if isinstance(r.get(key), int | float)]
            have.sort(key=lambda r, k=key: (-float(r[k]), _devices(r), _label(r)))
            for rank, r in enumerate(have[:top], start=1):
                out.append(
                    {
                        "metric": key,
                        "label": label,
                        "rank": rank,
                        "model": model,
                        "id": r["id"],
                        "cluster": _label(r),
                        "composition": (r.get("cluster") or {}).get("composition", ""),
                        "value": r[key],
                        "tokens_per_s": r["tokens_per_s"],
                        "devices": _devices(r),
                        "price_per_hour": r.get("price_per_hour"),
                        "settings": r.get("settings", {}),
                    }
                )
    return out


def _x(r: Mapping[str, Any], x: str) -> float | None:
    if x == "devices":
        return float(_devices(r))
    p = r.get("price_per_hour")
    return float(p) if isinstance(p, int | float) else None


def pareto_front(rows: Iterable[Mapping[str, Any]], x: XAxis = "devices") -> list[dict[str, Any]]:
    """Rows no other row of the same model beats on both fewer ``x`` and higher tokens/s, by x ascending.

    ``x="devices"`` counts the cluster's devices (what one pays for), not only those the plan uses.
    """
    if x not in ("devices", "price"):
        raise HapmoeError(f"x must be devices or price, got {x!r}", field="x")
    good = [r for r in ok_rows(rows) if _x(r, x) is not None]
    if x == "price" and not good and ok_rows(rows):
        raise HapmoeError("no result has a price; give device prices (--prices h800=2.5,...)", field="prices")
    out: list[dict[str, Any]] = []
    for model in sorted({r["model"] for r in good}):
        mine = sorted(
            (r for r in good if r["model"] == model),
            key=lambda r: (_x(r, x), -float(r["tokens_per_s"]), _label(r)),
        )
        best = -math.inf
        for r in mine:
            tps = float(r["tokens_per_s"])
            if tps > best:
                out.append(r)
                best = tps
    return out


def plot_sweep(rows: Iterable[Mapping[str, Any]], out_png: str | Path, x: XAxis = "devices") -> Path:
    """Scatter of throughput vs cluster devices (or price per hour), Pareto front marked, one colour per model."""
    from hapmoe_milp.plot import require_matplotlib, save_figure

    Figure, Canvas = require_matplotlib()
    rows = list(rows)
    front = pareto_front(rows, x)
    good = [r for r in ok_rows(rows) if _x(r, x) is not None]
    if not good:
        raise HapmoeError("no successful case to plot", field="out_png")
    fig = Figure(figsize=(8.0, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    models = sorted({r["model"] for r in good})
    colors = [f"C{i % 10}" for i in range(len(models))]
    for model, color in zip(models, colors):
        mine = [r for r in good if r["model"] == model]
        ax.scatter(
            [_x(r, x) for r in mine], [r["tokens_per_s"] for r in mine], s=18, alpha=0.5, color=color, label=model
        )
        pf = [r for r in front if r["model"] == model]
        if pf:
            xs = [_x(r, x) for r in pf]
            ys = [r["tokens_per_s"] for r in pf]
            ax.step(xs, ys, where="post", color=color, linewidth=1.2)
            ax.scatter(xs, ys, s=48, facecolors="none", edgecolors=color, linewidths=1.5)
            for r, xv, yv in zip(pf, xs, ys):
                ax.annotate(_label(r), (xv, yv), textcoords="offset points", xytext=(4, 4), fontsize=6)
    ax.set_xlabel("cluster devices" if x == "devices" else "cluster price per hour")
    ax.set_ylabel("tokens/s")
    ax.set_title(
        "sweep: throughput vs " + ("devices" if x == "devices" else "price") + " (circled: Pareto front)", fontsize=10
    )
    ax.scatter([], [], s=48, facecolors="none", edgecolors="black", linewidths=1.5, label="Pareto front")
    ax.margins(x=0.12, y=0.1)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, Canvas, out_png)
