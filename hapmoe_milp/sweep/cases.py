"""Sweep cases: what to solve. Cases from named clusters, or generated from ``DEVICE:MIN-MAX:STEP`` mixes
under a devices/price budget, crossed with a settings grid.

A case's id is a hash of (model, cluster spec, settings) in canonical spelling, independent of order and of
the run, so a resumed sweep skips exactly the cases already in its file and never duplicates one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from hapmoe_milp.config import Settings
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.limits import MAX_DEVICES, MAX_MIX_COUNTS, MAX_SWEEP_CASES, RANGE_PRICE_PER_HOUR
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import INLINE_RE

log = logging.getLogger(__name__)


# Keys a case's settings may carry: the solve() switches plus every Settings field.
SOLVE_KEYS = frozenset({"family", "optimizer_offload"})
SETTINGS_KEYS = frozenset(f.name for f in fields(Settings))
CASE_SETTING_KEYS = SOLVE_KEYS | SETTINGS_KEYS

MIX_RE = re.compile(
    r"^\s*(?P<dev>[A-Za-z0-9_.-]+)\s*:\s*(?P<lo>\d+)(?:\s*-\s*(?P<hi>\d+))?(?:\s*:\s*(?P<step>\d+))?\s*$", re.ASCII
)
BUDGET_RE = re.compile(r"^\s*(?P<key>devices|price)\s*(?P<op><=|<)\s*(?P<val>[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*$")


def _canon_ref(ref: str) -> str:
    """Canonical spelling of a model/cluster reference, so ids do not depend on case or whitespace."""
    s = ref.strip()
    if INLINE_RE.match(s):
        return re.sub(r"\s+", "", s).replace("*", "x").lower()
    if "/" in s or os.sep in s or s.endswith((".yaml", ".yml", ".json")):
        return s
    return s.lower()


def _json_value(v: Any, where: str) -> Any:
    try:
        return json.loads(json.dumps(v, allow_nan=False))
    except (TypeError, ValueError):
        raise HapmoeError(f"{v!r} is not a plain JSON value (number, string, bool)", field=where) from None


def _check_settings(settings: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    out = []
    for k in sorted(settings):
        if k not in CASE_SETTING_KEYS:
            raise HapmoeError(
                f"unknown setting {k!r}; known: {', '.join(sorted(CASE_SETTING_KEYS))}", field=f"settings.{k}"
            )
        v = settings[k]
        if v is None:
            continue
        out.append((k, _json_value(v, f"settings.{k}")))
    return tuple(out)


@dataclass(frozen=True)
class SweepCase:
    """One (model, cluster, settings) point. ``prices`` only labels the result; it is not part of the id."""

    model: str
    cluster: str
    settings: tuple[tuple[str, Any], ...] = ()
    prices: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def make(
        model: str,
        cluster: str,
        settings: Mapping[str, Any] | None = None,
        prices: Mapping[str, float] | None = None,
    ) -> SweepCase:
        return SweepCase(
            model=_canon_ref(model),
            cluster=_canon_ref(cluster),
            settings=_check_settings(settings or {}),
            prices=tuple(sorted((k.lower(), float(v)) for k, v in (prices or {}).items())),
        )

    @property
    def settings_dict(self) -> dict[str, Any]:
        return dict(self.settings)

    @property
    def id(self) -> str:
        key = json.dumps(
            {"model": self.model, "cluster": self.cluster, "settings": self.settings_dict},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def _settings_list(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """A grid is either {key: [values...]} (cartesian product, keys in the given order) or a list of dicts."""
    if grid is None:
        return [{}]
    if isinstance(grid, Mapping):
        keys = list(grid)
        values = []
        for k in keys:
            v = grid[k]
            vals = list(v) if isinstance(v, list | tuple) else [v]
            if not vals:
                raise HapmoeError("has no values", field=f"settings.{k}")
            values.append(vals)
        if math.prod(len(v) for v in values) > MAX_SWEEP_CASES:
            raise HapmoeError(f"the settings grid exceeds {MAX_SWEEP_CASES:,} combinations", field="settings")
        return [dict(zip(keys, combo)) for combo in itertools.product(*values)]
    out = [dict(g) for g in grid]
    return out or [{}]


def cases_from_clusters(
    models: Sequence[str],
    clusters: Sequence[str],
    settings_grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None = None,
    *,
    prices: Mapping[str, float] | None = None,
) -> list[SweepCase]:
    """Every model x cluster x settings combination, in that nesting order (deterministic)."""
    if not models:
        raise HapmoeError("needs at least one model", field="models")
    if not clusters:
        raise HapmoeError("needs at least one cluster", field="clusters")
    grid = _settings_list(settings_grid)
    n = len(models) * len(clusters) * len(grid)
    if n > MAX_SWEEP_CASES:
        raise HapmoeError(
            f"{len(models)} models x {len(clusters)} clusters x {len(grid)} settings = {n:,} cases, more than the "
            f"supported {MAX_SWEEP_CASES:,} per sweep",
            field="clusters",
        )
    return [SweepCase.make(m, c, s, prices) for m in models for c in clusters for s in grid]


@dataclass(frozen=True)
class MixRange:
    """Counts of one device type a mix sweeps over (already filtered by the node-size rule)."""

    device: str
    counts: tuple[int, ...]
    devices_per_node: int
    price_per_hour: float | None


@dataclass(frozen=True)
class Budget:
    """Upper limits on a generated cluster: total devices and/or total price per hour."""

    max_devices: float | None = None
    max_price: float | None = None
    strict_devices: bool = False
    strict_price: bool = False

    def allows(self, devices: int, price: float | None) -> bool:
        if self.max_devices is not None and not (
            devices < self.max_devices if self.strict_devices else devices <= self.max_devices
        ):
            return False
        if self.max_price is not None:
            assert price is not None
            if not (price < self.max_price if self.strict_price else price <= self.max_price + 1e-9):
                return False
        return True


def parse_budget(text: str | Budget | None) -> Budget | None:
    """``devices<=32``, ``price<=40``, or both comma-separated (``devices<=32,price<40``)."""
    if text is None or isinstance(text, Budget):
        return text
    b: dict[str, Any] = {}
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise HapmoeError(f"empty budget {text!r} (expected e.g. devices<=32 or price<=40)", field="budget")
    for part in parts:
        m = BUDGET_RE.match(part)
        if m is None:
            raise HapmoeError(f"cannot parse {part.strip()!r} (expected devices<=N or price<=X)", field="budget")
        key, strict, val = m.group("key"), m.group("op") == "<", float(m.group("val"))
        if not math.isfinite(val) or 0 < val < sys.float_info.min:
            raise HapmoeError(f"{part.strip()!r}: the bound must be a finite number", field="budget")
        if key == "devices":
            if val != int(val):
                raise HapmoeError(f"device budget must be a whole number, got {val:g}", field="budget")
            b["max_devices"], b["strict_devices"] = val, strict
        else:
            b["max_price"], b["strict_price"] = val, strict
    return Budget(**b)


def parse_prices(text: str | Mapping[str, float] | None) -> dict[str, float]:
    """``h800=2.5,910b=1.2``: USD (or any currency) per device-hour, overriding the device entries."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            k, sep, v = part.partition("=")
            if not sep or not k.strip():
                raise HapmoeError(f"cannot parse {part!r} (expected DEVICE=PRICE, e.g. h800=2.5)", field="prices")
            items.append((k.strip(), v.strip()))
    out: dict[str, float] = {}
    for k, v in items:
        try:
            p = float(v)
        except (TypeError, ValueError):
            raise HapmoeError(f"price of {k} is not a number: {v!r}", field="prices") from None
        lo, hi = RANGE_PRICE_PER_HOUR  # the range a device table's price must lie in
        if not math.isfinite(p) or not lo <= p <= hi or 0 < p < sys.float_info.min:
            raise HapmoeError(
                f"price of {k} must be a number in [{lo:g}, {hi:g}] per device-hour, got {v!r}", field="prices"
            )
        out[str(k).lower()] = p
    return out


def parse_mix(text: str, catalog: Catalog | None = None, prices: Mapping[str, float] | None = None) -> MixRange:
    """``DEVICE:MIN-MAX:STEP`` (``DEVICE:N`` and ``DEVICE:MIN-MAX`` too; STEP defaults to a node).

    Counts that are neither a whole number of nodes nor less than one node cannot be laid out
    (``parse_inline`` would refuse them), so they are dropped here; a range with no usable count is an error.
    """
    m = MIX_RE.match(text)
    if m is None:
        raise HapmoeError(
            f"cannot parse {text.strip()!r} (expected DEVICE:MIN-MAX:STEP, e.g. h800:0-32:8)", field="mixes"
        )
    cat = catalog or Catalog()
    dev = cat.device(m.group("dev"), "", "mixes")
    dpn = dev.devices_per_node
    lo = int(m.group("lo"))
    hi = int(m.group("hi")) if m.group("hi") is not None else lo
    step = int(m.group("step")) if m.group("step") is not None else dpn
    if hi < lo:
        raise HapmoeError(f"{text.strip()!r}: MAX {hi} is below MIN {lo}", field="mixes")
    if step <= 0:
        raise HapmoeError(f"{text.strip()!r}: STEP must be positive", field="mixes")
    if hi > MAX_DEVICES:
        raise HapmoeError(
            f"{text.strip()!r}: MAX {hi:,} exceeds the supported maximum of {MAX_DEVICES:,} devices per cluster",
            field="mixes",
        )
    if (hi - lo) // step + 1 > MAX_MIX_COUNTS:
        raise HapmoeError(
            f"{text.strip()!r} gives {(hi - lo) // step + 1:,} counts, more than the supported {MAX_MIX_COUNTS:,}; "
            "use a larger STEP",
            field="mixes",
        )
    counts = tuple(n for n in range(lo, hi + 1, step) if n == 0 or n < dpn or n % dpn == 0)
    skipped = [n for n in range(lo, hi + 1, step) if n not in counts]
    if skipped:
        log.info("--mix %s: skipping %s (not a whole number of %d-device nodes)", dev.id, skipped, dpn)
    if not counts:
        raise HapmoeError(
            f"{text.strip()!r} has no count that is a whole number of {dpn}-device {dev.id} nodes or less than one node",
            field="mixes",
        )
    price = (prices or {}).get(dev.id, dev.price_per_hour)
    return MixRange(device=dev.id, counts=counts, devices_per_node=dpn, price_per_hour=price)


def _split_mixes(mixes: str | Sequence[str]) -> list[str]:
    items = [mixes] if isinstance(mixes, str) else list(mixes)
    return [p for item in items for p in item.split(",") if p.strip()]


def mix_clusters(
    mixes: str | Sequence[str],
    budget: str | Budget | None = None,
    *,
    prices: Mapping[str, float] | str | None = None,
    catalog: Catalog | None = None,
) -> list[str]:
    """Inline cluster specs (``8xh800+16x910b``) for every combination of counts within the budget."""
    price_map = parse_prices(prices)
    ranges = [parse_mix(t, catalog, price_map) for t in _split_mixes(mixes)]
    if not ranges:
        raise HapmoeError("needs at least one DEVICE:MIN-MAX:STEP range", field="mixes")
    seen: set[str] = set()
    for r in ranges:
        if r.device in seen:
            raise HapmoeError(f"device {r.device} is given twice", field="mixes")
        seen.add(r.device)
    unused = sorted(set(price_map) - seen)
    if unused:
        raise HapmoeError(
            f"a price for {unused[0]}, which no --mix range uses ({', '.join(sorted(seen))})", field="prices"
        )
    combos = math.prod(len(r.counts) for r in ranges)
    if combos > MAX_SWEEP_CASES:
        raise HapmoeError(
            f"the ranges combine to {combos:,} clusters, more than the supported {MAX_SWEEP_CASES:,} per sweep; "
            "narrow them or use larger steps",
            field="mixes",
        )
    bud = parse_budget(budget)
    if bud is not None and bud.max_price is not None:
        missing = [r.device for r in ranges if r.price_per_hour is None]
        if missing:
            raise HapmoeError(
                f"a price budget needs a price for {', '.join(missing)}; pass --prices {missing[0]}=X,...",
                field="budget",
            )
    out: list[str] = []
    for combo in itertools.product(*(r.counts for r in ranges)):
        n = sum(combo)
        if n == 0:
            continue
        price = None
        if bud is not None and bud.max_price is not None:
            price = sum(c * (r.price_per_hour or 0.0) for c, r in zip(combo, ranges))
        if bud is not None and not bud.allows(n, price):
            continue
        out.append("+".join(f"{c}x{r.device}" for c, r in zip(combo, ranges) if c > 0))
    if not out:
        raise HapmoeError("no cluster in the mix ranges fits the budget", field="budget" if bud else "mixes")
    return out


def cases_from_mix(
    models: Sequence[str],
    mixes: str | Sequence[str],
    budget: str | Budget | None = None,
    *,
    prices: Mapping[str, float] | str | None = None,
    settings_grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None = None,
    catalog: Catalog | None = None,
) -> list[SweepCase]:
    """Cases for every model x mix combination (x settings), counts ascending, first device outermost."""
    price_map = parse_prices(prices)
    clusters = mix_clusters(mixes, budget, prices=price_map, catalog=catalog)
    return cases_from_clusters(models, clusters, settings_grid, prices=price_map)
