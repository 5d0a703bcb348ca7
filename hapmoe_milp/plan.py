"""Plans: ordered pipeline stages with device type, mesh, recompute and layer range.

Micro-batch semantics follow FlagScale's heterogeneous meshes, which reduce to Megatron's when every
stage has the same DP: one pipeline micro-batch step carries ``mbs * dp_0`` samples; stage ``i`` splits
them over its ``dp_i`` replicas (``b_i = mbs * dp_0 / dp_i`` samples each), and there are
``M = GBS / (mbs * dp_0)`` micro-batches per iteration.

A plan is self-contained: it carries every run setting it was solved under (``run_settings``, a full
:class:`Settings`), and its file embeds the model spec and the cluster's structure with content hashes
(format ``hapmoe-milp/plan/v2``), so ``estimate/export/validate --plan`` need nothing else and reproduce
the solver's numbers exactly. Files of the older ``v1`` format, which lack the settings beyond batch,
sequence, precision, imbalance and dispatcher, are refused with a message saying so.

A plan names the runtime it was searched for (``runtime``: a name from :mod:`hapmoe_milp.runtimes`, or
``any`` for the what-if space); its file records that runtime and the upstream commits its rules were
checked at. The field is optional within ``v2``: files written before it load with ``runtime`` None (not
recorded), and ``validate``/``export`` then check them against the target they are given.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hapmoe_milp.config import (
    FAMILIES,
    RECOMPUTE_LEVELS,
    Family,
    ParallelConfig,
    Recompute,
    Settings,
    check_choice,
    check_int,
    check_recompute,
    settings_from_dict,
)
from hapmoe_milp.errors import HapmoeError, PlanError, SpecError
from hapmoe_milp.fileio import dumps, write_text_atomic
from hapmoe_milp.limits import MAX_LAYERS, MAX_VPP
from hapmoe_milp.runtimes import ANY, RUNTIMES, Runtime, record
from hapmoe_milp.specs._fields import Fields, check_name, load_document, show
from hapmoe_milp.specs.cluster import ClusterSpec, cluster_hash, cluster_to_dict, device_hash
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.specs.model_doc import model_hash, model_to_dict

log = logging.getLogger(__name__)

PLAN_FORMAT = "hapmoe-milp/plan/v2"
OLD_FORMATS = ("hapmoe-milp/plan/v1",)


@dataclass(frozen=True)
class Stage:
    device: str
    cfg: ParallelConfig
    layer_start: int
    layer_end: int
    recompute: Recompute = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.device, str):
            raise PlanError(f"must be a device id, got {show(self.device)}", field="device")
        for name in ("layer_start", "layer_end"):
            v = getattr(self, name)
            if type(v) is not int or not 0 <= v <= MAX_LAYERS:
                object.__setattr__(self, name, check_int(name, v, 0, MAX_LAYERS))
        if self.recompute not in RECOMPUTE_LEVELS:
            object.__setattr__(self, "recompute", check_recompute(self.recompute))

    @property
    def devices(self) -> int:
        return self.cfg.devices

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start

    def label(self) -> str:
        """One stage in a few characters: ``h800x8[TP/CP/DP/EP/ETP] sel:12`` (device x count, mesh,
        recompute when not none, layers). Every report that names a stage uses this spelling."""
        c = self.cfg
        rec = {"none": "", "selective": " sel", "full": " full"}.get(self.recompute, f" {self.recompute}")
        return f"{self.device}x{self.devices}[{c.tp}/{c.cp}/{c.dp}/{c.ep}/{c.etp}]{rec}:{self.num_layers}"


#: The settings a plan records as its own fields (its run: batch, sequence, precision, imbalance, dispatcher),
#: in the order the settings layer checks them.
_RUN_FIELDS = ("seq_length", "global_batch_size", "micro_batch_size", "precision", "imbalance", "dispatcher")


@dataclass(frozen=True)
class Plan:
    """A pipeline of stages plus the run it was planned for.

    ``global_batch_size`` ... ``dispatcher`` are the settings most code reads directly; ``run_settings`` is
    the complete :class:`Settings` the plan was solved under (optimizer offload, overlap switches, memory
    headroom, ...). After construction ``run_settings`` always agrees with the direct fields (they win), so
    there is one truth. ``model_spec``/``cluster_spec`` are the specs, when known, so the file can embed
    them; they do not take part in equality.
    """

    model: str
    cluster: str
    family: Family
    stages: tuple[Stage, ...]
    global_batch_size: int
    seq_length: int
    micro_batch_size: int
    vpp: int = 1
    precision: str = "bf16"
    imbalance: float = 1.0
    dispatcher: str = "alltoall"
    predicted: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    solver: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    run_settings: Settings | None = None
    #: the runtime the plan was searched for (``any``: the what-if space; None: not recorded)
    runtime: str | None = field(default=None, compare=False, hash=False)
    model_spec: ModelSpec | None = field(default=None, compare=False, hash=False, repr=False)
    cluster_spec: ClusterSpec | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not isinstance(self.cluster, str):
            raise PlanError("model and cluster must be names", field="model")
        if self.family not in FAMILIES:
            check_choice("family", self.family, FAMILIES)
        if self.runtime is not None and self.runtime not in RUNTIME_NAMES:
            check_choice("runtime", self.runtime, RUNTIME_NAMES)
        stages = tuple(self.stages)
        if not stages or not all(isinstance(st, Stage) for st in stages):
            raise PlanError("must be a non-empty sequence of stages", field="stages")
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "vpp", check_int("vpp", self.vpp, 1, MAX_VPP))
        base = self.run_settings if self.run_settings is not None else Settings()
        run = self._run_fields_on(base)
        object.__setattr__(self, "run_settings", run)
        for name in _RUN_FIELDS:
            object.__setattr__(self, name, getattr(run, name))  # normalised by the settings layer

    def _run_fields_on(self, base: Settings) -> Settings:
        """``base`` with the run fields the plan records (:data:`_RUN_FIELDS`), checked by the settings layer."""
        return base.with_(**{name: getattr(self, name) for name in _RUN_FIELDS})

    @classmethod
    def from_settings(
        cls,
        model: ModelSpec,
        cluster: ClusterSpec,
        family: Family,
        stages: tuple[Stage, ...],
        settings: Settings,
        vpp: int = 1,
    ) -> Plan:
        """The plan of ``stages`` under ``settings``, carrying both specs (what a solver returns)."""
        return cls(
            model=model.name,
            cluster=cluster.name,
            family=family,
            stages=tuple(stages),
            global_batch_size=settings.global_batch_size,
            seq_length=settings.seq_length,
            micro_batch_size=settings.micro_batch_size,
            vpp=vpp,
            precision=settings.precision,
            imbalance=settings.imbalance,
            dispatcher=settings.dispatcher,
            run_settings=settings,
            model_spec=model,
            cluster_spec=cluster,
        )

    # ------------------------------------------------------------------ derived
    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def samples_per_microbatch(self) -> int:
        return self.micro_batch_size * self.stages[0].cfg.dp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // self.samples_per_microbatch

    def stage_micro_batch(self, i: int) -> int:
        return self.samples_per_microbatch // self.stages[i].cfg.dp

    @property
    def devices_used(self) -> int:
        return sum(s.devices for s in self.stages)

    def devices_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            out[s.device] = out.get(s.device, 0) + s.devices
        return out

    def settings(self, base: Settings | None = None) -> Settings:
        """The settings to evaluate the plan under: the ones it was solved under, or -- when ``base`` is
        given -- ``base`` with the plan's batch, sequence, precision, imbalance and dispatcher."""
        if base is None:
            assert self.run_settings is not None
            return self.run_settings
        return self._run_fields_on(base)

    def with_settings(self, settings: Settings) -> Plan:
        """The same stages under other run settings (batch fields included)."""
        return replace(
            self,
            run_settings=settings,
            global_batch_size=settings.global_batch_size,
            seq_length=settings.seq_length,
            micro_batch_size=settings.micro_batch_size,
            precision=settings.precision,
            imbalance=settings.imbalance,
            dispatcher=settings.dispatcher,
        )

    def with_runtime(self, runtime: Runtime | str | None) -> Plan:
        """The plan marked as searched for ``runtime`` (a :class:`Runtime` or its name; None: ``any``)."""
        name = runtime.name if isinstance(runtime, Runtime) else (runtime or ANY)
        return replace(self, runtime=name)

    def with_specs(self, model: ModelSpec | None, cluster: ClusterSpec | None) -> Plan:
        """The plan with the specs it belongs to attached (for embedding them in its file)."""
        return replace(
            self,
            model_spec=model if model is not None else self.model_spec,
            cluster_spec=cluster if cluster is not None else self.cluster_spec,
        )

    def layer_counts(self) -> list[int]:
        return [s.num_layers for s in self.stages]

    def slot_offsets(self, cluster: ClusterSpec) -> list[int]:
        """Index of each stage's first device among its type's devices (in the cluster's group order).

        A type's stages take its *last* devices, contiguously in pipeline order; any devices the plan
        leaves idle are the first ones. This is the placement the search assumes when it checks that no
        stage straddles a node boundary (it places stages from the last one backwards).
        """
        tail: dict[str, int] = {}
        for s in self.stages:
            tail[s.device] = tail.get(s.device, 0) + s.devices
        inv = cluster.inventory
        seen: dict[str, int] = {}
        out: list[int] = []
        for s in self.stages:
            before = seen.get(s.device, 0)
            out.append(inv.get(s.device, 0) - tail[s.device] + before)
            seen[s.device] = before + s.devices
        return out

    def placement(self, cluster: ClusterSpec) -> list[list[tuple[int, int]]]:
        """(group index, node index within group) of each stage's devices (see :meth:`slot_offsets`)."""
        cursor: dict[str, list[tuple[int, int]]] = {}
        for gi, g in enumerate(cluster.groups):
            slots = cursor.setdefault(g.device.id, [])
            for node in range(g.nodes):
                slots.extend([(gi, node)] * g.devices_per_node)
        return [
            cursor.get(s.device, [])[off : off + s.devices]
            for s, off in zip(self.stages, self.slot_offsets(cluster), strict=True)
        ]

    def label(self) -> str:
        """One line: family (and VPP when interleaved), then the stages' :meth:`Stage.label` joined by
        `` | `` -- what tables and logs print for a plan (bench/RESULTS.md quotes it)."""
        v = f" vpp{self.vpp}" if self.vpp > 1 else ""
        return f"{self.family}{v} " + " | ".join(s.label() for s in self.stages)

    def summary(self) -> dict[str, Any]:
        """The layout as a small JSON-ready mapping (no specs, no predictions): what a sweep row records."""
        return {
            "family": self.family,
            "runtime": self.runtime,
            "pp": self.pp,
            "vpp": self.vpp,
            "num_microbatches": self.num_microbatches,
            "micro_batch_size": self.micro_batch_size,
            "global_batch_size": self.global_batch_size,
            "seq_length": self.seq_length,
            "stages": [
                {
                    "device": s.device,
                    "devices": s.devices,
                    "layers": [s.layer_start, s.layer_end],
                    "config": s.cfg.label(),
                    "recompute": s.recompute,
                }
                for s in self.stages
            ],
        }

    def rank_ranges(self) -> list[tuple[int, int]]:
        """Global rank range [first, last] of each stage (pipeline stage s owns consecutive ranks)."""
        out, r = [], 0
        for s in self.stages:
            out.append((r, r + s.devices - 1))
            r += s.devices
        return out

    # ------------------------------------------------------------------ JSON
    def identity(self) -> dict[str, Any]:
        """``model`` and ``cluster`` blocks of the file: name, content hash and the spec when known."""
        model: dict[str, Any] = {"name": self.model}
        if self.model_spec is not None:
            model["sha256"] = model_hash(self.model_spec)
            model["spec"] = model_to_dict(self.model_spec)
        cluster: dict[str, Any] = {"name": self.cluster}
        if self.cluster_spec is not None:
            cs = self.cluster_spec
            cluster["sha256"] = cluster_hash(cs)
            cluster["spec"] = cluster_to_dict(cs)
            cluster["devices"] = {did: device_hash(cs.device(did)) for did in cs.device_types}
        return {"model": model, "cluster": cluster}

    def to_dict(self) -> dict[str, Any]:
        ident = self.identity()
        return {
            "format": PLAN_FORMAT,
            "model": ident["model"],
            "cluster": ident["cluster"],
            "family": self.family,
            **({"runtime": record(RUNTIMES.get(self.runtime))} if self.runtime is not None else {}),
            "settings": self.settings().to_dict(),
            "vpp": self.vpp,
            "num_microbatches": self.num_microbatches,
            "stages": [
                {
                    "device": s.device,
                    "devices": s.devices,
                    "ranks": list(r),
                    **asdict(s.cfg),
                    "recompute": s.recompute,
                    "layers": [s.layer_start, s.layer_end],
                }
                for s, r in zip(self.stages, self.rank_ranges(), strict=True)
            ],
            "predicted": self.predicted,
            "solver": self.solver,
        }

    def to_json(self) -> str:
        """Strict JSON (no NaN or Infinity: a bound that does not exist is null)."""
        return dumps(self.to_dict(), indent=2)

    def write(self, path: str | Path, *, field: str = "path") -> Path:
        """Write the plan file atomically (all or nothing)."""
        return write_text_atomic(path, self.to_json() + "\n", field=field)

    def with_predicted(self, predicted: dict[str, Any], solver: dict[str, Any] | None = None) -> Plan:
        return replace(self, predicted=predicted, solver=solver if solver is not None else self.solver)


# ---------------------------------------------------------------------- reading plan files
def _settings_from(f: Fields) -> Settings:
    sf = f.sub("settings")
    assert sf is not None
    doc = dict(sf.doc)
    try:
        return settings_from_dict(doc)
    except HapmoeError as exc:
        raise exc.at(source=f.source, field=f"settings.{exc.field}") from None


def _recompute_field(sf: Fields) -> str:
    try:
        return check_recompute(sf.raw("recompute", "none"))
    except HapmoeError as exc:
        raise exc.at(source=sf.source, field=sf.path("recompute")) from None


def _config_from(sf: Fields) -> ParallelConfig:
    try:
        return ParallelConfig(
            tp=sf.int_("tp", minimum=None),
            cp=sf.int_("cp", 1, minimum=None),
            dp=sf.int_("dp", minimum=None),
            ep=sf.int_("ep", 1, minimum=None),
            etp=sf.int_("etp", 1, minimum=None),
        )
    except HapmoeError as exc:
        if exc.source is not None:
            raise
        raise exc.at(source=sf.source, field=sf.path(exc.field or "")) from None


def _identity(f: Fields, key: str) -> tuple[str, dict[str, Any] | None, str | None, dict[str, str]]:
    """(name, embedded spec, sha256, device hashes) of the ``model`` or ``cluster`` block."""
    v = f.raw(key)
    if isinstance(v, str):  # a name only (a plan written without its specs)
        return check_name(v, f.source, key), None, None, {}
    blk = f.sub(key)
    assert blk is not None
    name = check_name(blk.str_("name"), f.source, f"{key}.name")
    spec = blk.raw("spec", None)
    if spec is not None and not isinstance(spec, dict):
        raise blk.err("spec", f"must be a mapping, got {type(spec).__name__}")
    sha = blk.str_("sha256", None)
    devices: dict[str, str] = {}
    if key == "cluster":
        dv = blk.raw("devices", {})
        if not isinstance(dv, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in dv.items()):
            raise blk.err("devices", "must map device ids to content hashes")
        devices = dict(dv)
    blk.reject_unknown()
    return name, spec, sha, devices


RUNTIME_NAMES: tuple[str, ...] = (*RUNTIMES, ANY)


def _runtime_from(f: Fields) -> str | None:
    """The ``runtime`` block's name (None when the file has none: written before plans recorded it)."""
    v = f.raw("runtime", None)
    if v is None:
        return None
    blk = f.sub("runtime")
    assert blk is not None
    name = blk.choice("name", RUNTIME_NAMES)
    for key in ("title", "note"):
        blk.str_(key, None)
    checked = blk.raw("checked", {})
    if not isinstance(checked, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in checked.items()):
        raise blk.err("checked", "must map repositories to the commits the runtime's rules were checked at")
    blk.reject_unknown()
    return name


def plan_from_dict(doc: dict[str, Any], source: str, catalog: Any = None) -> Plan:
    """Read a plan document; ``catalog`` (a :class:`~hapmoe_milp.specs.Catalog`) resolves the device
    tables of an embedded cluster. Every problem is a SpecError/PlanError naming the file and field."""
    f = Fields(doc, source)
    fmt = f.str_("format", PLAN_FORMAT)
    if fmt in OLD_FORMATS:
        raise f.err(
            "format",
            f"{fmt} plan files do not record the settings they were solved under (optimizer offload, overlap "
            "switches, memory headroom), so their estimate and export could differ from the solve; re-run "
            "`hapmoe-milp solve ... --out` to write a v2 plan",
        )
    if fmt != PLAN_FORMAT:
        raise f.err("format", f"unsupported plan format {show(fmt)} (expected {PLAN_FORMAT})")
    model_name, model_doc, model_sha, _ = _identity(f, "model")
    cluster_name, cluster_doc, cluster_sha, device_shas = _identity(f, "cluster")
    settings = _settings_from(f)
    raw_stages = f.list_("stages")
    if not raw_stages:
        raise f.err("stages", "must list at least one stage")
    if len(raw_stages) > MAX_LAYERS:
        raise f.err("stages", f"{len(raw_stages):,} stages exceed the supported maximum of {MAX_LAYERS:,}")
    stages: list[Stage] = []
    for i, sd in enumerate(raw_stages):
        sf = Fields(sd, source, f"stages[{i}]")
        cfg = _config_from(sf)
        layers = sf.list_("layers")
        if len(layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise sf.err("layers", f"must be [start, end) as two integers, got {show(layers)}")
        if not 0 <= layers[0] <= layers[1] <= MAX_LAYERS:
            raise sf.err("layers", f"must be 0 <= start <= end <= {MAX_LAYERS:,}, got {show(layers)}")
        sf.raw("ranks", None)  # derived (rank_ranges); checked below
        devices = sf.int_("devices", cfg.devices)
        if devices != cfg.devices:
            raise sf.err("devices", f"is {devices} but tp*cp*dp = {cfg.devices}")
        stages.append(
            Stage(
                device=check_name(sf.str_("device"), source, sf.path("device")),
                cfg=cfg,
                layer_start=layers[0],
                layer_end=layers[1],
                recompute=_recompute_field(sf),
            )
        )
        sf.reject_unknown()
    runtime = _runtime_from(f)
    predicted = f.raw("predicted", {})
    solver = f.raw("solver", {})
    for key, val in (("predicted", predicted), ("solver", solver)):
        if not isinstance(val, dict):
            raise f.err(key, f"must be a mapping, got {type(val).__name__}")
    try:
        plan = Plan(
            model=model_name,
            cluster=cluster_name,
            family=f.choice("family", FAMILIES),
            stages=tuple(stages),
            global_batch_size=settings.global_batch_size,
            seq_length=settings.seq_length,
            micro_batch_size=settings.micro_batch_size,
            vpp=f.int_("vpp", 1, maximum=MAX_VPP),
            precision=settings.precision,
            imbalance=settings.imbalance,
            dispatcher=settings.dispatcher,
            predicted=dict(predicted),
            solver=dict(solver),
            run_settings=settings,
            runtime=runtime,
        )
    except HapmoeError as exc:
        if exc.source is not None:
            raise
        raise exc.at(source=source, field=exc.field) from None
    for i, (sd, rr) in enumerate(zip(raw_stages, plan.rank_ranges(), strict=True)):
        ranks = sd.get("ranks")
        if ranks is not None and (not isinstance(ranks, list) or list(ranks) != list(rr)):
            raise SpecError(
                f"is {show(ranks)}, stage order implies {list(rr)}", source=source, field=f"stages[{i}].ranks"
            )
    m = f.int_("num_microbatches", None)
    f.reject_unknown()
    if m is not None and plan.global_batch_size % plan.samples_per_microbatch == 0 and m != plan.num_microbatches:
        raise SpecError(
            f"is {m} but global_batch_size / (micro_batch_size * dp of stage 0) = {plan.num_microbatches}",
            source=source,
            field="num_microbatches",
        )
    model_spec = _embedded_model(model_doc, model_name, model_sha, source)
    cluster_spec = _embedded_cluster(cluster_doc, cluster_name, cluster_sha, device_shas, source, catalog)
    return plan.with_specs(model_spec, cluster_spec)


def _embedded_model(doc: dict[str, Any] | None, name: str, sha: str | None, source: str) -> ModelSpec | None:
    if doc is None:
        return None
    from hapmoe_milp.specs.model_doc import model_from_dict

    m = model_from_dict(doc, f"{source}: model.spec")
    _check_embedded_name("model", m.name, name, source)
    if sha is not None:
        _check_embedded_hash("model", "spec", sha, model_hash(m), source)
    return m


def _embedded_cluster(
    doc: dict[str, Any] | None,
    name: str,
    sha: str | None,
    device_shas: dict[str, str],
    source: str,
    catalog: Any,
) -> ClusterSpec | None:
    if doc is None:
        return None
    from hapmoe_milp.specs.catalog import Catalog
    from hapmoe_milp.specs.cluster import cluster_from_dict

    cat = catalog if catalog is not None else Catalog()
    c = cluster_from_dict(doc, f"{source}: cluster.spec", cat.device)
    _check_embedded_name("cluster", c.name, name, source)
    changed = [did for did in c.device_types if did in device_shas and device_hash(c.device(did)) != device_shas[did]]
    if changed:
        log.warning(
            "%s: device table(s) %s differ from the ones this plan was solved with; estimates use the current "
            "tables and may differ from the plan's predicted numbers",
            source,
            ", ".join(changed),
        )
    elif sha is not None:
        _check_embedded_hash("cluster", "cluster", sha, cluster_hash(c), source)
    return c


def _check_embedded_name(part: str, spec_name: str, name: str, source: str) -> None:
    """The spec embedded as ``part`` (``model``/``cluster``) is the one the plan names."""
    if spec_name != name:
        raise SpecError(f"spec names {spec_name!r}, the plan names {name!r}", source=source, field=f"{part}.spec.name")


def _check_embedded_hash(part: str, noun: str, sha: str, digest: str, source: str) -> None:
    """The embedded ``part`` still hashes to the ``sha256`` the plan recorded: an edit by hand shows."""
    if digest != sha:
        raise SpecError(
            f"is {sha} but the embedded {noun} hashes to {digest} (was the file edited?)",
            source=source,
            field=f"{part}.sha256",
        )


def load_plan(path: str | Path, catalog: Any = None) -> Plan:
    return plan_from_dict(load_document(path), str(path), catalog)


# ---------------------------------------------------------------------- invariants
def check_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, source: str = "plan") -> None:
    """Invariants every plan must satisfy, whatever the target framework. Raises PlanError."""

    def bad(fld: str, msg: str) -> PlanError:
        return PlanError(msg, source=source, field=fld)

    n_layers = len(model.layer_kinds)
    pos = 0
    for i, s in enumerate(plan.stages):
        fld = f"stages[{i}]"
        if s.layer_start != pos:
            raise bad(f"{fld}.layers", f"starts at layer {s.layer_start}, expected {pos} (stages must be contiguous)")
        if s.layer_end < s.layer_start:
            raise bad(f"{fld}.layers", f"end {s.layer_end} is before start {s.layer_start}")
        pos = s.layer_end
        if s.device not in cluster.inventory:
            raise bad(f"{fld}.device", f"device type {show(s.device)} is not in cluster {cluster.name}")
        try:
            check_config(s.cfg, model, plan, cluster.node_size(s.device), f"{fld}")
        except PlanError as exc:
            raise exc.at(source=source, field=exc.field) from None
        if plan.samples_per_microbatch % s.cfg.dp:
            raise bad(
                f"{fld}.dp",
                f"micro-batch step of {plan.samples_per_microbatch} samples (mbs x dp of stage 0) is not divisible "
                f"by this stage's dp {s.cfg.dp}",
            )
    if pos != n_layers:
        raise bad("stages", f"cover {pos} layers, the model has {n_layers} (decoder + MTP)")
    if plan.family == "hetero":
        seen: list[str] = []
        for i, s in enumerate(plan.stages):
            if seen and seen[-1] == s.device:
                continue
            if s.device in seen:
                raise bad(
                    f"stages[{i}].device",
                    f"{s.device} stages must be contiguous in a hetero plan (FlagScale ranks processes by device type)",
                )
            seen.append(s.device)
    used = plan.devices_by_type()
    for did, n in used.items():
        have = cluster.inventory.get(did, 0)
        if n > have:
            raise bad("stages", f"use {n} {did} devices, cluster {cluster.name} has {have}")
    for i, (s, off) in enumerate(zip(plan.stages, plan.slot_offsets(cluster), strict=True)):
        node = cluster.node_size(s.device)
        if s.devices <= node and off // node != (off + s.devices - 1) // node:
            raise bad(f"stages[{i}].devices", f"{s.devices} {s.device} devices at slot {off} straddle a node boundary")
        if s.devices > node and off % node:
            raise bad(
                f"stages[{i}].devices", f"{s.devices} {s.device} devices must start on a node boundary, start {off}"
            )
    if plan.global_batch_size % plan.samples_per_microbatch:
        raise bad(
            "global_batch_size",
            f"{plan.global_batch_size} is not divisible by micro_batch_size x dp of stage 0 "
            f"({plan.samples_per_microbatch})",
        )
    if plan.vpp > 1:
        if plan.pp < 2:
            raise bad("vpp", "virtual pipeline stages need pipeline size > 1")
        if plan.num_microbatches % plan.pp:
            raise bad("vpp", f"interleaved 1F1B needs num_microbatches ({plan.num_microbatches}) divisible by pp")
        for i, s in enumerate(plan.stages):
            # a chunk needs a layer, except the first rank's first chunk (the embedding alone, ``E|``) and the
            # last rank's last chunk (the loss alone, ``|L``) -- unless MTP layers must share the loss chunk
            edge = i == 0 or (i == plan.pp - 1 and "mtp" not in model.layer_kinds[s.layer_start : s.layer_end])
            need = plan.vpp - 1 if edge else plan.vpp
            if s.num_layers < need:
                raise bad(
                    "vpp",
                    f"{plan.vpp} virtual chunks per stage, but stage {i} holds only {s.num_layers} layer(s); every "
                    "chunk needs at least one (the first stage's first chunk may hold only the embedding, the last "
                    "stage's last only the loss)",
                )
    if plan.family == "megatron":
        first = plan.stages[0]
        for i, s in enumerate(plan.stages):
            if s.cfg != first.cfg:
                raise bad(f"stages[{i}]", f"megatron plans need one mesh shape; {s.cfg.label()} != {first.cfg.label()}")


def check_config(cfg: ParallelConfig, model: ModelSpec, plan: Plan | None, node_size: int, fld: str) -> None:
    """Megatron's per-mesh rules (reference/megatron.md §2.7) plus ours: TP and ETP inside a node."""

    def bad(sub: str, msg: str) -> PlanError:
        return PlanError(msg, field=f"{fld}.{sub}" if fld else sub)

    if model.num_attention_heads % cfg.tp:
        raise bad("tp", f"num_attention_heads {model.num_attention_heads} is not divisible by tp {cfg.tp}")
    if model.groups % cfg.tp and cfg.tp % model.groups:
        raise bad("tp", f"num_query_groups {model.groups} and tp {cfg.tp} do not divide each other")
    if cfg.tp > node_size:
        raise bad("tp", f"tp {cfg.tp} exceeds the node size {node_size}")
    if cfg.etp > node_size:
        raise bad("etp", f"etp {cfg.etp} exceeds the node size {node_size}")
    if model.is_moe:
        if (model.num_experts or 0) % cfg.ep:
            raise bad("ep", f"num_experts {model.num_experts} is not divisible by ep {cfg.ep}")
    elif cfg.ep != 1 or cfg.etp != 1:
        raise bad("ep", "a dense model needs ep = etp = 1")
    if cfg.edp == 0:
        raise bad("ep", f"etp x ep = {cfg.etp * cfg.ep} does not divide the stage's {cfg.devices} devices")
    seq = plan.seq_length if plan else model.defaults.seq_length
    if cfg.cp > 1 and seq % (2 * cfg.cp):
        raise bad("cp", f"seq_length {seq} is not divisible by 2 x cp = {2 * cfg.cp}")
