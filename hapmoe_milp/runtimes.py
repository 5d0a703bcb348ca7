"""What each training runtime runs: its vendors, the versions its rules were checked at, and the plan
features it supports, each rule citing the upstream source (pinned commit) it was read from.

This is the one place these facts live. The search reads a :class:`Runtime` to build only the plans it
runs (:mod:`hapmoe_milp.space` and :mod:`hapmoe_milp.instance` filter options, the DP and the exact
formulation enforce the rules that tie stages together), ``validate`` checks plans against the same
fields, and each exporter writes the runtime's own launch files. So a search for a runtime never returns
a plan its export refuses.

Four runtimes (``RUNTIMES``):

* ``megatron`` -- upstream NVIDIA Megatron-LM on NVIDIA GPUs: one mesh shape for every stage (the
  ``megatron`` plan family), VPP with ``--pipeline-model-parallel-layout``, context parallelism.
* ``rocm`` -- AMD's ROCm fork of Megatron-LM on AMD GPUs: the upstream flags (its ``arguments.py``
  carries the same layout grammar and checks), plus ROCm's environment and ``--no-gradient-accumulation-
  fusion`` (the fused weight-gradient kernel is CUDA-only); see :mod:`hapmoe_milp.export.rocm`.
* ``mindspeed`` -- MindSpeed-LLM on Ascend NPUs (Megatron core 0.12.1 underneath): uneven layers through
  its ``--num-layer-list``, which excludes virtual pipelines, so VPP is not searched.
* ``flagscale`` -- FlagScale's heterogeneous process meshes, the one runtime that spans vendors (through
  FlagCX): per-stage meshes (the ``hetero`` family), no VPP (FlagScale #431, ``pre_validate_args``), CP 1,
  EP in all meshes or none, the first and last mesh with one TP when they share an embedding, and every
  mesh after the first holding at least two pipeline stages (its layer offset is applied only when the
  mesh's own PP > 1).

``any`` is not a runtime: it is the what-if space (both families, each stage free within Megatron's
per-mesh rules), whose answers no single runtime is known to run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hapmoe_milp.config import RECOMPUTE_LEVELS, RECOMPUTE_MODULES, Family, Recompute, parse_recompute
from hapmoe_milp.errors import SettingsError
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

ANY = "any"
AUTO = "auto"


@dataclass(frozen=True)
class Source:
    """Where a rule was read: repository, pinned commit, file (and what it says there, in our words)."""

    repo: str
    commit: str
    path: str
    note: str = ""

    def cite(self) -> str:
        return f"{self.repo}@{self.commit[:10]}:{self.path}"


# ---------------------------------------------------------------------- the pinned sources
MEGATRON_COMMIT = "3bec9aa97dda898d16ff5a89bac0ed2b6682b172"  # NVIDIA/Megatron-LM tag core_v0.16.0
MEGATRON_012 = "a845aa7e12b3a117e24c2352b9e3e60bad2e3a17"  # core_v0.12.1, MindSpeed-LLM's Megatron
ROCM_COMMIT = "dbdea57365399cd88fd84605e74191f6a932ee16"  # ROCm/Megatron-LM arguments.py
ROCM_EXAMPLE = "07c55f77e4956508d85b269a5910d5f1f8111b92"  # ROCm/Megatron-LM examples/mixtral/train_mixtral_moe.sh
MINDSPEED_COMMIT = "c77308a14bfcb1aa7ca61da9c1aa24a893cb1b91"  # Ascend/MindSpeed-LLM master, 2026-08-21
FLAGSCALE_COMMIT = "da4935ec60193e735bc70b81e259ed04eefd0132"  # FlagOpen/FlagScale main, 2025-11-13
FLAGCX_HCCL = "1adfb82ab321688afcb3060fcfc7c5462a633bd4"  # FlagOpen/FlagCX flagcx/adaptor/hccl_adaptor.cc
FLAGCX_HIP = "0c3d90fd199ddaa4a2aa220f98de85ae33c46e25"  # FlagOpen/FlagCX flagcx/adaptor/device/hip_adaptor.cc

_MG = "NVIDIA/Megatron-LM"
_FS = "FlagOpen/FlagScale"
_MS = "Ascend/MindSpeed-LLM"
_RC = "ROCm/Megatron-LM"
_MG_ARGS = "megatron/training/arguments.py"
_FS_ARGS = "flagscale/train/arguments.py"


@dataclass(frozen=True)
class Runtime:
    """One training runtime and what it runs.

    Search-facing fields (read by space/instance/search and by ``validate``):

    - ``family``: the plan family it runs (``megatron``: one mesh shape; ``hetero``: per-stage meshes);
    - ``vpp``: virtual pipeline stages (interleaved 1F1B) may be searched;
    - ``cp``: context parallelism > 1 may be searched;
    - ``recompute``: recompute levels a stage may take (``mixed_recompute``: may stages differ, and
      among which levels);
    - ``ep_all_or_none``: EP > 1 in every mesh or in none;
    - ``edge_tp``: with a shared embedding (tied weights, or MTP) the first and last stage have one TP;
      ``edge_dp_divisible``: and their DPs divide one another (distributed optimizer);
    - ``mesh_min_stages``: every mesh (run of identical consecutive stages) after the first holds at
      least this many stages;
    - ``mtp_with_decoder``: the last stage holds a decoder layer besides the MTP layers (the runtime's
      layer split counts decoder layers per stage, each at least one);
    - ``hybrid``: it builds hybrid (Mamba) models (Megatron's ``pretrain_mamba.py``), which then run
      without virtual pipeline stages (Megatron's MambaStack).

    Settings-facing fields: ``fp8_vendors``, ``dispatchers``, ``recompute_modules``; ``ep_overlap``: it has
    ``--overlap-moe-expert-parallel-comm``; ``cuda_graphs``: it has ``--cuda-graph-impl``/``--cuda-graph-scope``
    (where its upstream version was not checked for one, False).
    ``cites`` maps every field name above (and ``vendors``) to its :class:`Source`, and records what all
    four share: ETP set independently of TP (``etp``) and optimizer CPU offload (``optimizer_offload``).
    """

    name: str
    title: str
    vendors: frozenset[str]
    checked: tuple[Source, ...]
    family: Family
    vpp: bool
    cp: bool
    recompute: tuple[Recompute, ...]
    mixed_recompute: tuple[Recompute, ...]
    ep_all_or_none: bool
    edge_tp: bool
    edge_dp_divisible: bool
    mesh_min_stages: int
    mtp_with_decoder: bool
    hybrid: bool
    fp8_vendors: frozenset[str]
    dispatchers: tuple[str, ...]
    recompute_modules: tuple[str, ...]
    ep_overlap: bool
    cuda_graphs: bool
    cites: Mapping[str, Source] = field(default_factory=dict, compare=False)

    @property
    def version(self) -> dict[str, str]:
        """The sources this runtime's rules were checked at, ``repo -> commit`` (recorded in plans)."""
        out: dict[str, str] = {}
        for s in self.checked:
            out.setdefault(s.repo, s.commit)
        return out

    def runs_vendors(self, vendors: Iterable[str]) -> bool:
        return set(vendors) <= self.vendors

    def runs_recompute(self, level: Recompute) -> bool:
        """Whether a stage may take recompute ``level``: a ladder level it lists; ``full:K``/``uniform:N``
        (Megatron's block and uniform methods of full recompute) where it runs ``full``; a module set where
        it runs selective recompute and knows every module (``--recompute-modules``)."""
        spec = parse_recompute(level)  # one parser for every recompute value (config.py)
        if spec.name in self.recompute:
            return True
        if spec.granularity == "full":
            return "full" in self.recompute
        return "selective" in self.recompute and all(m in self.recompute_modules for m in spec.modules)

    def cite(self, feature: str) -> str:
        src = self.cites.get(feature)
        return src.cite() if src is not None else self.checked[0].cite()


SEARCH_FIELDS = (
    "vendors",
    "family",
    "vpp",
    "cp",
    "recompute",
    "mixed_recompute",
    "ep_all_or_none",
    "edge_tp",
    "edge_dp_divisible",
    "mesh_min_stages",
    "mtp_with_decoder",
    "hybrid",
    "fp8_vendors",
    "dispatchers",
    "recompute_modules",
    "ep_overlap",
    "cuda_graphs",
)


def _megatron_cites(repo: str, commit: str) -> dict[str, Source]:
    return {
        "family": Source(repo, commit, _MG_ARGS, "one TP/CP/EP/ETP/DP for every pipeline rank"),
        "vpp": Source(repo, commit, _MG_ARGS, "--num-virtual-stages-per-pipeline-rank with --pipeline-model-parallel-layout"),
        "cp": Source(repo, commit, _MG_ARGS, "--context-parallel-size; seq_length % (2 cp) == 0"),
        "recompute": Source(repo, commit, _MG_ARGS, "--recompute-granularity full|selective, one setting for all layers"),
        "mixed_recompute": Source(repo, commit, _MG_ARGS, "recompute flags are global"),
        "etp": Source(repo, commit, _MG_ARGS, "--expert-tensor-parallel-size"),
        "ep_all_or_none": Source(repo, commit, _MG_ARGS, "one EP for every rank"),
        "edge_tp": Source(repo, commit, _MG_ARGS, "one TP for every rank"),
        "edge_dp_divisible": Source(repo, commit, _MG_ARGS, "one DP for every rank"),
        "mesh_min_stages": Source(repo, commit, _MG_ARGS, "a single mesh"),
        "mtp_with_decoder": Source(repo, commit, "megatron/core/transformer/pipeline_parallel_layer_layout.py",
                                   "the layout places MTP ('t') in the last stage, decoder layers optional"),
        "dispatchers": Source(repo, commit, _MG_ARGS, "--moe-token-dispatcher-type allgather|alltoall|flex"),
        "hybrid": Source(repo, commit, "pretrain_mamba.py", "hybrid models through the Mamba stack"),
        "optimizer_offload": Source(repo, commit, _MG_ARGS, "--optimizer-cpu-offload with --use-precision-aware-optimizer"),
        "recompute_modules": Source(repo, commit, _MG_ARGS,
                                    "--recompute-modules (core_v0.16: core_attn moe_act layernorm mla_up_proj mlp moe "
                                    "shared_experts; kept to layernorm moe_act where the pinned core is older)"),
    }  # fmt: skip


MEGATRON = Runtime(
    name="megatron",
    title="Megatron-LM (NVIDIA)",
    vendors=frozenset({"nvidia"}),
    checked=(Source(_MG, MEGATRON_COMMIT, _MG_ARGS, "tag core_v0.16.0"),),
    family="megatron",
    vpp=True,
    cp=True,
    recompute=RECOMPUTE_LEVELS,
    mixed_recompute=(),
    ep_all_or_none=True,
    edge_tp=True,
    edge_dp_divisible=True,
    mesh_min_stages=1,
    mtp_with_decoder=False,
    hybrid=True,
    fp8_vendors=frozenset({"nvidia"}),
    dispatchers=("allgather", "alltoall", "flex"),
    recompute_modules=RECOMPUTE_MODULES,
    ep_overlap=True,
    cuda_graphs=True,
    cites={
        **_megatron_cites(_MG, MEGATRON_COMMIT),
        "vendors": Source(_MG, MEGATRON_COMMIT, "README.md", "CUDA GPUs; Transformer Engine for FP8"),
        "ep_overlap": Source(
            _MG,
            MEGATRON_COMMIT,
            "megatron/core/transformer/transformer_config.py",
            "overlap_moe_expert_parallel_comm and its checks",
        ),
        "cuda_graphs": Source(
            _MG,
            MEGATRON_COMMIT,
            "megatron/core/transformer/transformer_config.py",
            "cuda_graph_impl local|transformer_engine, cuda_graph_scope",
        ),
        "fp8_vendors": Source(_MG, MEGATRON_COMMIT, _MG_ARGS, "--fp8-format through Transformer Engine (CUDA)"),
    },
)

ROCM = Runtime(
    name="rocm",
    title="Megatron-LM, ROCm fork (AMD)",
    vendors=frozenset({"amd"}),
    checked=(
        Source(_RC, ROCM_COMMIT, _MG_ARGS, "the upstream argument set, layout grammar and validate_args"),
        Source(_RC, ROCM_EXAMPLE, "examples/mixtral/train_mixtral_moe.sh", "ROCm environment and flags"),
    ),
    family="megatron",
    vpp=True,
    cp=True,
    recompute=RECOMPUTE_LEVELS,
    mixed_recompute=(),
    ep_all_or_none=True,
    edge_tp=True,
    edge_dp_divisible=True,
    mesh_min_stages=1,
    mtp_with_decoder=False,
    hybrid=True,
    fp8_vendors=frozenset({"amd"}),
    dispatchers=("allgather", "alltoall"),
    recompute_modules=RECOMPUTE_MODULES,
    ep_overlap=False,
    cuda_graphs=False,
    cites={
        **_megatron_cites(_RC, ROCM_COMMIT),
        "ep_overlap": Source(_RC, ROCM_COMMIT, _MG_ARGS, "not checked there for --overlap-moe-expert-parallel-comm"),
        "cuda_graphs": Source(_RC, ROCM_COMMIT, _MG_ARGS, "not checked there for --cuda-graph-impl (HIP graphs)"),
        "vendors": Source(_RC, ROCM_EXAMPLE, "examples/mixtral/train_mixtral_moe.sh", "HIP/RCCL environment"),
        "fp8_vendors": Source(_RC, ROCM_EXAMPLE, "examples/mixtral/train_mixtral_moe.sh", "PR=fp8: --fp8-format hybrid"),
        "dispatchers": Source(_RC, ROCM_EXAMPLE, "examples/mixtral/train_mixtral_moe.sh",
                              "alltoall; flex needs DeepEP, a CUDA library"),
    },
)  # fmt: skip

MINDSPEED = Runtime(
    name="mindspeed",
    title="MindSpeed-LLM (Ascend)",
    vendors=frozenset({"huawei"}),
    checked=(
        Source(_MS, MINDSPEED_COMMIT, "mindspeed_llm/features_manager/pipeline_parallel/num_layer_list.py"),
        Source(_MG, MEGATRON_012, _MG_ARGS, "core_v0.12.1, the Megatron MindSpeed-LLM runs on (its README)"),
    ),
    family="megatron",
    vpp=False,
    cp=True,
    recompute=("none", "selective", "full"),
    mixed_recompute=(),
    ep_all_or_none=True,
    edge_tp=True,
    edge_dp_divisible=True,
    mesh_min_stages=1,
    mtp_with_decoder=True,
    hybrid=False,
    fp8_vendors=frozenset(),
    dispatchers=("allgather", "alltoall"),
    recompute_modules=("layernorm", "moe_act"),
    ep_overlap=False,
    cuda_graphs=False,
    cites={
        **_megatron_cites(_MG, MEGATRON_012),
        "ep_overlap": Source(_MG, MEGATRON_012, "megatron/core/transformer/transformer_config.py",
                             "no overlap_moe_expert_parallel_comm at core_v0.12.1"),
        "cuda_graphs": Source(_MG, MEGATRON_012, _MG_ARGS, "no --cuda-graph-impl at core_v0.12.1; NPUs run no CUDA graphs"),
        "vendors": Source(_MS, MINDSPEED_COMMIT, "README.md", "Ascend NPUs, Megatron core_v0.12.1"),
        "vpp": Source(_MS, MINDSPEED_COMMIT, "mindspeed_llm/features_manager/pipeline_parallel/num_layer_list.py",
                      "--num-layer-list and a virtual pipeline cannot be enabled at the same time"),
        "mtp_with_decoder": Source(_MS, MINDSPEED_COMMIT, "mindspeed_llm/training/arguments.py",
                                   "num_layer_list counts decoder layers per stage; MTP rides on the last"),
        "fp8_vendors": Source(_MS, MINDSPEED_COMMIT, "README.md", "no FP8 on Atlas 800T A2 (910B)"),
        "dispatchers": Source(_MG, MEGATRON_012, _MG_ARGS, "flex needs DeepEP, a CUDA library"),
        "hybrid": Source(_MS, MINDSPEED_COMMIT, "pretrain_gpt.py", "our export launches its GPT entry point"),
    },
)  # fmt: skip

_FS_CITES = {
    "vendors": Source("FlagOpen/FlagCX", FLAGCX_HCCL, "flagcx/adaptor/hccl_adaptor.cc",
                      "FlagCX bridges NCCL, HCCL (Ascend) and RCCL (AMD, device/hip_adaptor.cc); "
                      "FlagScale selects it with distributed_backend flagcx"),
    "family": Source(_FS, FLAGSCALE_COMMIT, "flagscale/train/hetero/parallel_context.py",
                     "a (tp, cp, ep, dp, pp) process mesh per block of pipeline stages"),
    "vpp": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS, "pre_validate_args: 'virtual pipeline not support now!' (#431)"),
    "cp": Source(_FS, FLAGSCALE_COMMIT, "flagscale/train/hetero/parallel_context.py",
                 "ParallelContext: 'Context parallelism is not supported.'"),
    "recompute": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS, "recompute_granularity_per_stage_micro_batch"),
    "mixed_recompute": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS,
                              "post_validate_args: per-stage flags switch full recompute on or off"),
    "etp": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS, "expert_tensor_parallel_size_per_process_mesh"),
    "ep_all_or_none": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS,
                             "intended by pre_validate_args (its assertion is always true; FlagScale #717)"),
    "edge_tp": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS, "tied embeddings or MTP: first and last mesh same tp"),
    "edge_dp_divisible": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS,
                                "first/last mesh dp divide one another with the distributed optimizer"),
    "mesh_min_stages": Source(_FS, FLAGSCALE_COMMIT,
                              "flagscale/backends/Megatron-LM/megatron/core/transformer/transformer_layer.py.patch",
                              "get_transformer_layer_offset adds the hetero offset only when the mesh's "
                              "pipeline_model_parallel_size > 1 (pre_validate_args sets it to the mesh's pp)"),
    "mtp_with_decoder": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS,
                               "hetero_pipeline_layer_split counts decoder layers; MTP on the last stage"),
    "hybrid": Source(_FS, FLAGSCALE_COMMIT, "flagscale/train/train_gpt.py", "the hetero entry builds GPT models"),
    "fp8_vendors": Source(_FS, FLAGSCALE_COMMIT, "flagscale/backends/Megatron-LM", "FP8 through Transformer Engine"),
    "dispatchers": Source(_FS, FLAGSCALE_COMMIT, "examples/deepseek_v3/conf/train/hetero.yaml",
                          "alltoall; flex (DeepEP) is CUDA-only"),
    "optimizer_offload": Source(_FS, FLAGSCALE_COMMIT, "flagscale/backends/Megatron-LM",
                                "pinned Megatron 8479eb35 (core 0.15) has --optimizer-cpu-offload"),
    "recompute_modules": Source(_FS, FLAGSCALE_COMMIT, "flagscale/backends/Megatron-LM", "core 0.15 --recompute-modules"),
    "ep_overlap": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS,
                         "not checked with heterogeneous meshes (the pinned core has the flag)"),
    "cuda_graphs": Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS, "not checked with heterogeneous meshes"),
}  # fmt: skip

FLAGSCALE = Runtime(
    name="flagscale",
    title="FlagScale heterogeneous meshes (cross-vendor)",
    vendors=frozenset({"nvidia", "huawei", "amd"}),
    checked=(Source(_FS, FLAGSCALE_COMMIT, _FS_ARGS, "pins Megatron-LM 8479eb35 (core 0.15)"),),
    family="hetero",
    vpp=False,
    cp=False,
    recompute=RECOMPUTE_LEVELS,
    mixed_recompute=("none", "full"),
    ep_all_or_none=True,
    edge_tp=True,
    edge_dp_divisible=True,
    mesh_min_stages=2,
    mtp_with_decoder=True,
    hybrid=False,
    fp8_vendors=frozenset({"nvidia"}),
    dispatchers=("allgather", "alltoall"),
    recompute_modules=RECOMPUTE_MODULES,
    ep_overlap=False,
    cuda_graphs=False,
    cites=_FS_CITES,
)

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (MEGATRON, ROCM, MINDSPEED, FLAGSCALE)}
RUNTIME_CHOICES: tuple[str, ...] = (AUTO, *RUNTIMES, ANY)


def get(name: str) -> Runtime:
    rt = RUNTIMES.get(name)
    if rt is None:
        raise SettingsError(f"must be one of {', '.join(RUNTIMES)}, got {name!r}", field="runtime")
    return rt


def searched_families(rt: Runtime) -> tuple[Family, ...]:
    """The plan families a search for ``rt`` covers: a per-stage-mesh runtime (FlagScale) also runs the
    one-mesh plans, a special case of its meshes (under its own rules: no VPP, CP 1, two stages per later
    mesh); searching them too gives its search a fast first plan and uniform selective recompute."""
    return ("megatron", "hetero") if rt.family == "hetero" else ("megatron",)


def cluster_vendors(cluster: ClusterSpec) -> frozenset[str]:
    return frozenset(cluster.device(d).vendor for d in cluster.device_types)


def runtimes_for(cluster: ClusterSpec) -> list[Runtime]:
    """Every runtime that runs the cluster's vendor mix (single-vendor runtimes first)."""
    vendors = cluster_vendors(cluster)
    return [r for r in RUNTIMES.values() if r.runs_vendors(vendors)]


def settings_problem(
    rt: Runtime,
    cluster: ClusterSpec,
    precision: str,
    dispatcher: str,
    ep_overlap: bool = False,
    cuda_graph_scope: str = "none",
) -> str | None:
    """Why ``rt`` cannot run these settings on ``cluster`` at all (None when it can)."""
    vendors = cluster_vendors(cluster)
    if not rt.runs_vendors(vendors):
        return f"{rt.title} runs {', '.join(sorted(rt.vendors))} devices, the cluster has {', '.join(sorted(vendors))}"
    if precision == "fp8" and not vendors <= rt.fp8_vendors:
        return f"{rt.title} has no FP8 training on {', '.join(sorted(vendors - rt.fp8_vendors))} devices"
    if dispatcher not in rt.dispatchers:
        return f"{rt.title} has no {dispatcher!r} token dispatcher (it has {', '.join(rt.dispatchers)})"
    if ep_overlap and not rt.ep_overlap:
        return f"{rt.title} has no EP-communication overlap here ({rt.cite('ep_overlap')})"
    if cuda_graph_scope != "none" and not rt.cuda_graphs:
        return f"{rt.title} has no CUDA-graph capture here ({rt.cite('cuda_graphs')})"
    return None


def resolve(name: str, cluster: ClusterSpec) -> list[Runtime] | None:
    """The runtimes a ``--runtime`` choice searches: ``auto`` every one that runs the cluster's vendors,
    a name that one (refused when it cannot run the vendors), ``any`` None (the what-if space)."""
    if not isinstance(name, str) or name not in RUNTIME_CHOICES:
        raise SettingsError(f"must be one of {', '.join(RUNTIME_CHOICES)}, got {name!r}", field="runtime")
    if name == ANY:
        return None
    if name == AUTO:
        found = runtimes_for(cluster)
        if not found:
            vendors = ", ".join(sorted(cluster_vendors(cluster)))
            raise SettingsError(f"no runtime runs the vendor mix {vendors}; use --runtime any", field="runtime")
        return found
    rt = get(name)
    vendors = cluster_vendors(cluster)
    if not rt.runs_vendors(vendors):
        raise SettingsError(
            f"{rt.title} runs {', '.join(sorted(rt.vendors))} devices, cluster {cluster.name} has "
            f"{', '.join(sorted(vendors))}; runtimes for it: {', '.join(r.name for r in runtimes_for(cluster)) or 'none'}",
            field="runtime",
        )
    return [rt]


def shared_embedding(model: ModelSpec) -> bool:
    """Whether the first and last stage share a weight: tied input/output embeddings, or MTP, whose
    layers reuse the embedding on the last stage."""
    return (not model.untie_embeddings_and_output_weights) or model.mtp_num_layers > 0


def record(rt: Runtime | None) -> dict[str, object]:
    """The ``runtime`` block of a plan file: the runtime and the sources its rules were checked at."""
    if rt is None:
        return {"name": ANY, "note": "what-if space: no single runtime is known to run this plan"}
    return {"name": rt.name, "title": rt.title, "checked": rt.version}


__all__ = [
    "ANY",
    "AUTO",
    "FLAGSCALE",
    "MEGATRON",
    "MINDSPEED",
    "ROCM",
    "RUNTIMES",
    "RUNTIME_CHOICES",
    "SEARCH_FIELDS",
    "Runtime",
    "Source",
    "cluster_vendors",
    "get",
    "record",
    "resolve",
    "runtimes_for",
    "searched_families",
    "settings_problem",
    "shared_embedding",
]
