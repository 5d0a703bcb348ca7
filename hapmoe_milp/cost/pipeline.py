"""Iteration time of a pipeline: the closed form the search optimises, and an event-driven simulator.

Closed form (per-stage time ``tau_s = t_f + t_b + 2 d_s`` where ``d_s`` is the p2p delay of the
boundary out of stage s): for 1F1B ``T = sum(tau) + (M-1) max(tau)``; for interleaved 1F1B with ``v``
virtual stages ``T = sum(tau)/v + (M - 1/v) max(tau)``; then the exposed DP sync + optimizer of the
slowest-finishing stage. Both are ``alpha*sum + beta*max``, which keeps the search linear.

The simulator runs Megatron's actual op order per rank with dependencies and p2p delays; it is exact
where the closed form is approximate (unequal stages, delays) and is the judge in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hapmoe_milp.errors import SettingsError
from hapmoe_milp.limits import MAX_SIMULATED_OPS


def pipeline_coefficients(num_microbatches: int, vpp: int = 1) -> tuple[float, float]:
    """(alpha, beta) with ``T_pipe = alpha * sum(tau) + beta * max(tau)``."""
    if vpp <= 1:
        return 1.0, float(num_microbatches - 1)
    return 1.0 / vpp, num_microbatches - 1.0 / vpp


def closed_form(taus: Sequence[float], num_microbatches: int, vpp: int = 1) -> float:
    a, b = pipeline_coefficients(num_microbatches, vpp)
    return a * sum(taus) + b * max(taus)


def in_flight(stage: int, pp: int, num_microbatches: int, vpp: int = 1) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the stage's full layers.

    1F1B: ``min(M, P - s)``. Interleaved: Megatron's warm-up count ``2(P-s-1) + (v-1)P + 1`` chunks,
    each holding 1/v of the rank's layers.
    """
    if vpp <= 1:
        return float(min(num_microbatches, pp - stage))
    chunks = min(num_microbatches * vpp, 2 * (pp - stage - 1) + (vpp - 1) * pp + 1)
    return chunks / vpp


@dataclass(frozen=True)
class Timeline:
    """Simulated schedule: per stage, the list of (kind, microbatch, chunk, start, end)."""

    makespan: float
    stage_end: tuple[float, ...]
    ops: tuple[tuple[tuple[str, int, int, float, float], ...], ...]


def _op_order(rank: int, pp: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron's forward/backward op order for one pipeline rank (non-interleaved and interleaved)."""
    if v <= 1:
        warm = min(pp - rank - 1, m)
        order: list[tuple[str, int, int]] = [("F", i, 0) for i in range(warm)]
        f, bk = warm, 0
        while f < m:
            order.append(("F", f, 0))
            f += 1
            order.append(("B", bk, 0))
            bk += 1
        while bk < m:
            order.append(("B", bk, 0))
            bk += 1
        return order
    total = m * v

    def fchunk(k: int) -> tuple[int, int]:
        group, within = divmod(k, pp * v)
        chunk = within // pp
        return group * pp + within % pp, chunk

    def bchunk(k: int) -> tuple[int, int]:
        mb, chunk = fchunk(k)
        return mb, v - 1 - chunk

    warm = min(total, 2 * (pp - rank - 1) + (v - 1) * pp)
    order = []
    for k in range(warm):
        mb, c = fchunk(k)
        order.append(("F", mb, c))
    fk, bkk = warm, 0
    while fk < total:
        mb, c = fchunk(fk)
        order.append(("F", mb, c))
        fk += 1
        mb, c = bchunk(bkk)
        order.append(("B", mb, c))
        bkk += 1
    while bkk < total:
        mb, c = bchunk(bkk)
        order.append(("B", mb, c))
        bkk += 1
    return order


def simulate(
    t_fwd: Sequence[float],
    t_bwd: Sequence[float],
    delays: Sequence[float],
    num_microbatches: int,
    vpp: int = 1,
) -> Timeline:
    """Event-driven 1F1B / interleaved-1F1B schedule.

    ``delays[s]`` is the p2p time of the boundary between stage s-1 and s (``delays[0]`` is ignored).
    Per-op time of a virtual chunk is the stage time divided by ``vpp``. Communication does not occupy
    the compute stream (it only delays the dependent op), as with asynchronous send/recv.
    """
    pp = len(t_fwd)
    m, v = num_microbatches, max(1, vpp)
    ops_total = 2 * pp * m * v
    if ops_total > MAX_SIMULATED_OPS:  # checked before any list is built: 16M micro-batches took minutes
        raise SettingsError(
            f"{m:,} micro-batches x {pp} stages x {v} chunks = {ops_total:,} forward/backward operations, more than "
            f"the simulator takes ({MAX_SIMULATED_OPS:,}); use the closed form (the two agree on equal stages)",
            field="simulate",
        )
    orders = [_op_order(r, pp, m, v) for r in range(pp)]
    done: dict[tuple[str, int, int, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    ops: list[list[tuple[str, int, int, float, float]]] = [[] for _ in range(pp)]
    remaining = sum(len(o) for o in orders)
    last_chunk = v - 1
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, mb, c = orders[r][pos[r]]
                if kind == "F":
                    if r > 0:
                        dep = ("F", mb, c, r - 1)
                        lag = delays[r]
                    elif c > 0:
                        dep = ("F", mb, c - 1, pp - 1)
                        lag = delays[0] if pp > 1 else 0.0
                    else:
                        dep = None
                        lag = 0.0
                    dur = t_fwd[r] / v
                else:
                    if r < pp - 1:
                        dep = ("B", mb, c, r + 1)
                        lag = delays[r + 1]
                    elif c < last_chunk:
                        dep = ("B", mb, c + 1, 0)
                        lag = delays[0] if pp > 1 else 0.0
                    else:
                        dep = ("F", mb, c, r)
                        lag = 0.0
                    dur = t_bwd[r] / v
                if dep is not None and dep not in done:
                    break
                ready = done[dep] + lag if dep is not None else 0.0
                start = max(free[r], ready)
                end = start + dur
                done[(kind, mb, c, r)] = end
                free[r] = end
                ops[r].append((kind, mb, c, start, end))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (invalid op order)")
    ends = tuple(free)
    return Timeline(makespan=max(ends), stage_end=ends, ops=tuple(tuple(o) for o in ops))
