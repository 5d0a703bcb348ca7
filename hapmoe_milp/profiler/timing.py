"""The timing core every micro-benchmark goes through.

Accelerator kernels are asynchronous: a call returns when the work is *queued*, not done. A timer that
reads the clock without synchronising measures launch overhead, and one that starts the clock while earlier
work is still queued charges that work to the kernel under test. :func:`time_fn` is correct by
construction: it synchronises before starting the clock and after every timed batch, excludes warm-up calls
(first-call costs: allocator growth, kernel selection/autotuning, JIT, cold caches), and reports the median,
which one slow outlier (a preemption, a clock ramp) cannot move.

No torch here: the synchronisation is a plain callable (``torch.cuda.synchronize``, ``torch.npu.synchronize``,
a barrier, or nothing on CPU), so the core is testable without an accelerator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Clock = Callable[[], float]


def _no_sync() -> None:
    """CPU kernels complete before they return; nothing to wait for."""


@dataclass(frozen=True)
class Timing:
    """Seconds per call of the timed function (each sample is one batch of ``number`` calls / ``number``)."""

    median: float
    p10: float
    p90: float
    samples: tuple[float, ...]
    number: int = 1

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: a noise indicator worth reporting next to a table point."""
        return (self.p90 - self.p10) / self.median if self.median > 0 else math.inf


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def time_fn(
    fn: Callable[[], object],
    *,
    warmup: int,
    repeats: int,
    sync: Callable[[], object] | None = None,
    number: int = 1,
    clock: Clock = time.perf_counter,
) -> Timing:
    """Time ``fn``: ``warmup`` untimed calls, then ``repeats`` samples of ``number`` back-to-back calls.

    Order per sample: ``sync(); t0 = clock(); fn() x number; sync(); t1 = clock()``. The leading sync
    drains anything queued before the sample (warm-up work, the caller's earlier kernels); the trailing
    sync makes the clock read happen after the work has finished, not after it was queued. ``number > 1``
    amortises the sync and launch latency for kernels of a few microseconds (nccl-tests does the same with
    its ``-n`` iterations).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if number < 1:
        raise ValueError(f"number must be >= 1, got {number}")
    do_sync = sync or _no_sync
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(repeats):
        do_sync()
        t0 = clock()
        for _ in range(number):
            fn()
        do_sync()
        t1 = clock()
        samples.append((t1 - t0) / number)
    return Timing(
        median=percentile(samples, 50.0),
        p10=percentile(samples, 10.0),
        p90=percentile(samples, 90.0),
        samples=tuple(samples),
        number=number,
    )


def calls_per_sample(
    fn: Callable[[], object],
    *,
    sync: Callable[[], object] | None = None,
    target_s: float,
    max_number: int = 1000,
    clock: Clock = time.perf_counter,
) -> int:
    """How many back-to-back calls make one sample last about ``target_s``.

    Runs ``fn`` twice, synchronised, and keeps the faster call (the first one pays first-call costs); both
    double as warm-up calls. Kernels far shorter than the sync overhead are batched so that overhead is
    amortised; long kernels get ``number = 1``.
    """
    do_sync = sync or _no_sync
    dt = math.inf
    for _ in range(2):
        do_sync()
        t0 = clock()
        fn()
        do_sync()
        dt = min(dt, clock() - t0)
    if dt <= 0:
        return max_number
    return max(1, min(max_number, int(target_s / dt)))
