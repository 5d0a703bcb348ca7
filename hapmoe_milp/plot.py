"""Pictures of a plan: the simulated 1F1B schedule per pipeline stage.

The closed form the search optimises hides *where* the bubble is; a timeline drawn from the event-driven
simulator (the judge in tests) shows which stage is the bottleneck, how long warm-up and cool-down take and
how much of the iteration is DP sync and optimizer. matplotlib is an optional extra (``plot``), imported
only when a picture is asked for, and drawn on an Agg canvas without pyplot so no global backend changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import plan_stage_totals
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.pipeline import Timeline, simulate
from hapmoe_milp.cost.stage import StageTotals
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.fileio import OutputError
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

PLOT_INSTALL_HINT = "pip install 'hapmoe-milp[plot]' (or: pip install 'matplotlib>=3.8')"

FWD_COLOR = "#4C72B0"
BWD_COLOR = "#DD8452"
SYNC_COLOR = "#8C8C8C"
# Micro-batch numbers are written into boxes only when there are few enough to be legible.
LABEL_MAX_MICROBATCHES = 16


def require_matplotlib(field: str = "out_png") -> tuple[Any, Any]:
    """(Figure, FigureCanvasAgg), or a HapmoeError with the install hint when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise HapmoeError(
            f"plotting needs matplotlib, which is not installed ({exc}); {PLOT_INSTALL_HINT}", field=field
        ) from None
    return Figure, FigureCanvasAgg


def check_png_path(path: str | Path, field: str = "out_png") -> Path:
    """The pictures are PNG files: a ``.txt`` or ``.pdf`` name would get PNG bytes under a wrong name."""
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise HapmoeError(f"{p}: the picture is written as PNG; give a .png file name", field=field)
    return p


def save_figure(fig: Any, canvas_cls: Any, out_png: str | Path) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas_cls(fig)
    try:
        fig.savefig(out, dpi=120, format="png")
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {exc}", field="out_png") from None
    log.info("wrote %s", out)
    return out


@dataclass(frozen=True)
class Schedule:
    """The simulated timeline of a plan plus what the picture labels need."""

    timeline: Timeline
    totals: tuple[StageTotals, ...]
    sync_s: tuple[float, ...]
    num_microbatches: int
    vpp: int

    @property
    def iteration_time_s(self) -> float:
        return max(end + y for end, y in zip(self.timeline.stage_end, self.sync_s, strict=True))

    @property
    def busy_fraction(self) -> tuple[float, ...]:
        """Share of the pipeline makespan each stage spends computing (1 - its bubble share)."""
        span = self.timeline.makespan or 1.0
        return tuple(sum(op[4] - op[3] for op in ops) / span for ops in self.timeline.ops)


def simulate_plan(
    model: ModelSpec | str,
    cluster: ClusterSpec | str,
    plan: Plan,
    *,
    settings: Settings | None = None,
    catalog: Catalog | None = None,
) -> Schedule:
    """Run the event-driven 1F1B simulator on the cost model's per-stage times for ``plan``."""
    cat = catalog or Catalog()
    m = cat.model(model) if isinstance(model, str) else model
    c = cat.cluster(cluster) if isinstance(cluster, str) else cluster
    st = plan.settings(settings)
    totals = plan_stage_totals(CostModel(m, c, st), plan)
    delays = [0.0] + [t.p2p_out / max(1, plan.vpp) for t in totals[:-1]]  # one hop per chunk
    tl = simulate([t.fwd for t in totals], [t.bwd for t in totals], delays, plan.num_microbatches, plan.vpp)
    sync = tuple(t.sync for t in totals)
    return Schedule(tl, tuple(totals), sync, plan.num_microbatches, max(1, plan.vpp))


def _time_unit(span_s: float) -> tuple[float, str]:
    if span_s < 1e-3:
        return 1e6, "µs"
    if span_s < 1.0:
        return 1e3, "ms"
    return 1.0, "s"


def plot_schedule(
    model: ModelSpec | str,
    cluster: ClusterSpec | str,
    plan: Plan,
    out_png: str | Path,
    *,
    settings: Settings | None = None,
    catalog: Catalog | None = None,
) -> Path:
    """Draw the simulated 1F1B (or interleaved) timeline, one row per stage, and write a PNG.

    Forward and backward boxes have different colours; with virtual stages, later chunks are drawn
    lighter. The grey box after each stage's last op is its exposed DP sync + optimizer step, so the
    right edge of the picture is the iteration time the estimate reports for a simulated schedule.
    """
    Figure, Canvas = require_matplotlib()
    from matplotlib.patches import Patch

    sched = simulate_plan(model, cluster, plan, settings=settings, catalog=catalog)
    tl = sched.timeline
    pp = len(tl.ops)
    scale, unit = _time_unit(sched.iteration_time_s)
    label_mb = sched.num_microbatches <= LABEL_MAX_MICROBATCHES
    fig = Figure(figsize=(min(18.0, 6.0 + 0.25 * len(tl.ops[0])), 1.2 + 0.6 * pp))
    ax = fig.add_subplot(1, 1, 1)
    height = 0.8
    min_label_width = sched.iteration_time_s * scale / 60.0
    busy = sched.busy_fraction
    edge = 0.4 if sched.num_microbatches * sched.vpp <= 64 else 0.0  # thin boxes would be all edge
    for r, ops in enumerate(tl.ops):
        y = pp - 1 - r  # stage 0 on top
        groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for kind, mb, chunk, start, end in ops:
            w = (end - start) * scale
            groups.setdefault((kind, chunk), []).append((start * scale, w))
            if label_mb and w >= min_label_width:
                ax.text(start * scale + w / 2, y, str(mb + 1), ha="center", va="center", fontsize=7, color="white")
        for (kind, chunk), boxes in sorted(groups.items()):
            ax.broken_barh(
                boxes,
                (y - height / 2, height),
                facecolors=FWD_COLOR if kind == "F" else BWD_COLOR,
                alpha=1.0 - 0.45 * chunk / (sched.vpp - 1) if sched.vpp > 1 else 1.0,
                edgecolor="white",
                linewidth=edge,
            )
        if sched.sync_s[r] > 0:
            ax.broken_barh(
                [(tl.stage_end[r] * scale, sched.sync_s[r] * scale)],
                (y - height / 2, height),
                facecolors=SYNC_COLOR,
                edgecolor="white",
                linewidth=edge,
            )
        ax.text(
            (tl.stage_end[r] + sched.sync_s[r]) * scale,
            y,
            f" {100 * busy[r]:.0f}% busy",
            ha="left",
            va="center",
            fontsize=7,
        )
    labels = []
    for i, s in enumerate(plan.stages):
        labels.append(f"S{i} {s.device}×{s.devices}\nL{s.layer_start}-{s.layer_end - 1} {s.cfg.label()}")
    ax.set_yticks(list(range(pp)))
    ax.set_yticklabels(list(reversed(labels)), fontsize=7)
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, sched.iteration_time_s * scale * 1.08)
    ax.set_ylim(-0.6, pp - 0.4)
    vpp = f", vpp={sched.vpp}" if sched.vpp > 1 else ""
    ax.set_title(
        f"{plan.model} on {plan.cluster}: {plan.family} pp={pp}{vpp}, M={sched.num_microbatches}, "
        f"iteration {sched.iteration_time_s * scale:.3g} {unit} (simulated)",
        fontsize=9,
    )
    ax.legend(
        handles=[
            Patch(facecolor=FWD_COLOR, label="forward"),
            Patch(facecolor=BWD_COLOR, label="backward"),
            Patch(facecolor=SYNC_COLOR, label="DP sync + optimizer"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18 if pp > 2 else -0.3),
        ncol=3,
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout()
    return save_figure(fig, Canvas, out_png)


__all__ = ["Schedule", "plot_schedule", "require_matplotlib", "simulate_plan"]
