"""The timing core: correct durations, warm-up excluded, synchronisation before every clock read.

No torch needed: kernels are simulated with sleeps, and an "asynchronous" kernel is a thread whose work only
shows up after the sync function joins it -- the way a CUDA kernel only shows up after synchronize().
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.profiler import ProfilerError, TorchMissingError, require_torch
from hapmoe_milp.profiler.timing import Timing, calls_per_sample, percentile, time_fn

SLEEP = 0.02


class FakeStream:
    """Launch returns at once; the work runs on a thread; sync joins every outstanding launch."""

    def __init__(self) -> None:
        self.pending: list[threading.Thread] = []
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        t = threading.Thread(target=time.sleep, args=(seconds,))
        t.start()
        self.pending.append(t)

    def sync(self) -> None:
        self.syncs += 1
        while self.pending:
            self.pending.pop().join()


def test_slow_kernel_duration_within_tolerance() -> None:
    t = time_fn(lambda: time.sleep(SLEEP), warmup=1, repeats=5)
    assert isinstance(t, Timing)
    assert len(t.samples) == 5
    assert SLEEP <= t.median < SLEEP + 0.03
    assert t.p10 <= t.median <= t.p90


def test_warmup_is_excluded_from_samples() -> None:
    calls = {"n": 0}

    def first_call_slow() -> None:
        calls["n"] += 1
        time.sleep(0.3 if calls["n"] == 1 else 0.005)

    t = time_fn(first_call_slow, warmup=1, repeats=2)
    # with 2 samples the median is their mean, so an included 0.3 s call would put it above 0.15 s
    assert max(t.samples) < 0.1
    assert t.median < 0.1
    assert calls["n"] == 3
    # the counterfactual: without warm-up the slow first call lands in the samples
    calls["n"] = 0
    t0 = time_fn(first_call_slow, warmup=0, repeats=2)
    assert max(t0.samples) >= 0.3


def test_async_kernel_is_timed_to_completion_only_with_sync() -> None:
    s = FakeStream()
    no_sync = time_fn(lambda: s.launch(SLEEP), warmup=0, repeats=3)
    s.sync()
    assert no_sync.median < SLEEP / 2, "the fake kernel must look asynchronous without a sync"
    synced = time_fn(lambda: s.launch(SLEEP), warmup=1, repeats=3, sync=s.sync)
    assert synced.median >= SLEEP
    assert synced.median < SLEEP + 0.03


def test_pending_work_is_drained_before_the_clock_starts() -> None:
    s = FakeStream()
    s.launch(0.3)  # the caller's earlier work, still queued
    t = time_fn(lambda: s.launch(SLEEP), warmup=0, repeats=1, sync=s.sync)
    assert t.samples[0] < 0.15, "earlier queued work was charged to the kernel under test"
    assert t.samples[0] >= SLEEP


def test_order_of_sync_clock_and_calls() -> None:
    events: list[str] = []
    ticks = iter(range(1000))

    def clock() -> float:
        events.append("clock")
        return float(next(ticks))

    time_fn(lambda: events.append("fn"), warmup=2, repeats=2, sync=lambda: events.append("sync"), number=3, clock=clock)
    sample = ["sync", "clock", "fn", "fn", "fn", "sync", "clock"]
    assert events == ["fn", "fn", *sample, *sample]


def test_number_divides_the_batch() -> None:
    calls = {"n": 0}

    def fn() -> None:
        calls["n"] += 1
        time.sleep(0.005)

    t = time_fn(fn, warmup=2, repeats=3, number=4)
    assert calls["n"] == 2 + 3 * 4
    assert t.number == 4
    assert 0.005 <= t.median < 0.02


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, warmup=0, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        time_fn(lambda: None, warmup=-1, repeats=1)
    with pytest.raises(ValueError, match="number"):
        time_fn(lambda: None, warmup=0, repeats=1, number=0)


def test_percentile_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17):
        xs = list(rng.random(n))
        for q in (0, 10, 50, 90, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_calls_per_sample_batches_short_kernels_only() -> None:
    n_short = calls_per_sample(lambda: time.sleep(0.001), target_s=0.02)
    assert 3 <= n_short <= 20
    assert calls_per_sample(lambda: time.sleep(0.03), target_s=0.02) == 1
    s = FakeStream()
    # an async kernel probed with its sync is seen at its real duration
    assert calls_per_sample(lambda: s.launch(0.03), sync=s.sync, target_s=0.02) == 1
    assert s.syncs >= 4


def test_missing_torch_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(TorchMissingError, match=r"pip install 'hapmoe-milp\[profile\]'") as ei:
        require_torch()
    assert isinstance(ei.value, ProfilerError)
    assert isinstance(ei.value, HapmoeError)
    from hapmoe_milp.profiler.kernels import profile_device

    with pytest.raises(TorchMissingError):
        profile_device("x", quick=True)


def test_importing_the_profiler_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import hapmoe_milp.profiler as p\n"
        "import hapmoe_milp.profiler.kernels, hapmoe_milp.profiler.collectives\n"
        "import hapmoe_milp.profiler.table_writer, hapmoe_milp.profiler.compare\n"
        "p.write_device_table, p.compare_tables, p.time_fn\n"
        "assert 'torch' not in sys.modules, 'torch imported at module level'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
