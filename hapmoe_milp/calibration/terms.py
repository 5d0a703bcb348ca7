"""Which runtime terms a fit may move, shared by whom, and how far.

Two kinds of term, by what can measure them:

- **kernel terms** (GEMM/attention/HBM efficiencies, grouped-GEMM tiling, dispatch bandwidths and
  latency) belong to one chip and are measured by kernel and collective micro-benchmarks. A fit may move
  one only on a device that has an applicable micro-benchmark row, and only inside the range that keeps
  every such row within its tolerance (:func:`hapmoe_milp.calibration.microbench.term_interval`). Where
  no row applies the term stays at its prior: end-to-end runs cannot tell a slow GEMM from a slow
  all-to-all, so they must not be allowed to decide.
- **stack terms** (host idle per kernel, sync cost, overlap shares) are what only end-to-end runs show.
  They belong to a software stack (framework, container, host), so one value is shared by every device
  of that stack (pooled): a term fitted to H100 and B200 runs of one Megatron-Core release together, not
  fourteen free numbers per device.

A :class:`Term` is one fit coordinate ``z`` (0 at the start): a positive parameter becomes
``start * exp(z)`` on each of its devices, a fraction ``start + z``, so a shared term moves devices that
start from different values together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hapmoe_milp.calibration.microbench import Row, term_interval
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.runtime import PARAM_INFO

KERNEL_TERMS = (
    "gemm_scale",
    "fp8_gemm_scale",
    "grouped_rows_half",
    "attention_scale",
    "ssd_efficiency",
    "gdn_efficiency",
    "memory_efficiency",
    "a2a_intra_GBps",
    "a2a_inter_GBps",
    "flex_intra_GBps",
    "flex_inter_GBps",
    "ep_latency_us",
)
STACK_TERMS = (
    "launch_us",
    "call_us",
    "sync_us",
    "stack_compute_scale",
    "ep_overlap",
    "flex_overlap",
    "tp_overlap",
    "p2p_exposed",
    "dp_overlap",
)
#: Prior width of a stack term in its fit coordinate (log for positive terms: 0.5 is about x1.6; fractions in
#: units of their range), by where its starting value came from.
PRIOR_SIGMA = {"source": 0.2, "measured": 0.2, "derived": 0.5, "calibrated": 0.5, "assumed": 1.0}


def log_space(name: str) -> bool:
    return PARAM_INFO[name].lo > 0


@dataclass(frozen=True)
class Term:
    """One fit coordinate: parameter ``name`` on ``devices`` for runs of ``stack``."""

    name: str
    stack: str
    devices: tuple[str, ...]
    lo: float  # bounds on the coordinate z
    hi: float
    sigma: float  # prior width in z
    bounded_by: str  # what set the bounds: micro-benchmark rows, or the physical range

    @property
    def key(self) -> str:
        where = self.stack if self.name in STACK_TERMS else "+".join(self.devices)
        return f"{self.name}@{where}"

    @property
    def log(self) -> bool:
        return log_space(self.name)

    def value(self, start: float, z: float) -> float:
        info = PARAM_INFO[self.name]
        v = start * math.exp(z) if self.log else start + z
        return min(info.hi, max(info.lo, v))


def _z_range(name: str, start: float, lo: float, hi: float) -> tuple[float, float]:
    if log_space(name):
        return math.log(lo / start), math.log(hi / start)
    return lo - start, hi - start


def make_terms(
    stacks: Mapping[str, Sequence[str]],
    bases: Mapping[str, DeviceSpec],
    rows: Sequence[Row],
    names: Sequence[str] | None = None,
) -> tuple[list[Term], list[str]]:
    """The fit coordinates for ``stacks`` (stack -> devices its runs use), and one line per term left out
    and why. ``names`` restricts the parameters considered."""
    wanted = list(names) if names is not None else [*STACK_TERMS, *KERNEL_TERMS]
    terms: list[Term] = []
    skipped: list[str] = []
    for stack, devs in sorted(stacks.items()):
        for name in wanted:
            if name in STACK_TERMS:
                t = _stack_term(name, stack, devs, bases, rows)
                if t is not None:
                    terms.append(t)
                continue
            for d in devs:
                t, why = _kernel_term(name, stack, bases[d], rows)
                if t is not None:
                    terms.append(t)
                elif why:
                    skipped.append(why)
    return terms, skipped


def _stack_term(
    name: str, stack: str, devs: Sequence[str], bases: Mapping[str, DeviceSpec], rows: Sequence[Row]
) -> Term | None:
    info = PARAM_INFO[name]
    lo, hi = -math.inf, math.inf
    bounded = []
    sig = 0.0
    for d in devs:
        dev = bases[d]
        start = float(getattr(dev.runtime, name))
        iv = term_interval(dev, name, rows)
        a, b = (iv[0], iv[1]) if iv else (info.lo, info.hi)
        if iv:
            bounded += list(iv[2])
        za, zb = _z_range(name, start, max(a, 1e-12) if log_space(name) else a, b)
        lo, hi = max(lo, za), min(hi, zb)
        s = PRIOR_SIGMA[dev.runtime_basis(name)]
        sig = max(sig, s if log_space(name) else s * (info.hi - info.lo))
    if not hi > lo:
        return None
    why = ("micro-benchmark rows " + ", ".join(bounded)) if bounded else f"physical range [{info.lo:g}, {info.hi:g}]"
    return Term(name, stack, tuple(devs), lo, hi, sig, why)


def _kernel_term(name: str, stack: str, dev: DeviceSpec, rows: Sequence[Row]) -> tuple[Term | None, str]:
    iv = term_interval(dev, name, rows)
    if iv is None:
        return None, f"{name}@{dev.id}: kept at its prior (no micro-benchmark row measures it on {dev.id})"
    start = float(getattr(dev.runtime, name))
    lo, hi = _z_range(name, start, iv[0], iv[1])
    if not hi > lo:
        return None, f"{name}@{dev.id}: kept (its micro-benchmark rows {', '.join(iv[2])} leave no room)"
    # the prior spans the measured range: half its width is one sigma
    sigma = max(1e-6, (hi - lo) / 2)
    return Term(name, stack, (dev.id,), lo, hi, sigma, "micro-benchmark rows " + ", ".join(iv[2])), ""


def apply_terms(
    bases: Mapping[str, DeviceSpec],
    terms: Sequence[Term],
    z: Sequence[float],
    stack: str,
    *,
    whole_stack: bool = False,
) -> dict[str, DeviceSpec]:
    """The device tables a run of ``stack`` sees with the coordinates ``z``. ``whole_stack`` applies a stack
    term to every device in ``bases``, not only those whose runs fitted it: a held-out run on a device the
    training runs of its stack did not use still runs that stack's software."""
    vals: dict[str, dict[str, float]] = {}
    for t, zi in zip(terms, z, strict=True):
        if t.stack != stack:
            continue
        targets = tuple(bases) if whole_stack and t.name in STACK_TERMS else t.devices
        for d in targets:
            start = float(getattr(bases[d].runtime, t.name))
            vals.setdefault(d, {})[t.name] = t.value(start, float(zi))
    return {d: replace(dev, runtime=dev.runtime.with_values(vals[d])) if d in vals else dev for d, dev in bases.items()}
