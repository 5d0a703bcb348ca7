"""Catalog commands: ``models``, ``clusters``, ``devices`` -- list the shipped specs or show one."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from hapmoe_milp.cli.options import (
    STATE,
    JsonOpt,
    catalog_cluster,
    catalog_model,
)
from hapmoe_milp.cli.output import emit_json

log = logging.getLogger("hapmoe_milp")


def models(
    name: Annotated[str | None, typer.Argument(help="Catalog name or path (YAML or HF config.json).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the model catalog, or show one model (parameter counts, FLOPs per token)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        m = catalog_model(name, "NAME")
        d = m.summary()
        d["sources"] = list(m.sources)
        if m.official:
            d["official"] = {
                "total_b": m.official.total_b,
                "active_b": m.official.active_b,
                "active_convention": m.official.active_convention,
            }
        if as_json:
            emit_json(d)
        else:
            render.console().print(render.kv_table(m.name, d))
        return
    rows = [cat.model(n).summary() for n in cat.model_names()]
    if as_json:
        emit_json(rows)
    else:
        render.console().print(render.models_table(rows))


def clusters(
    name: Annotated[str | None, typer.Argument(help="Catalog name, path, or inline form like 8xh800+16x910b.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the cluster catalog, or show one cluster."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        c = catalog_cluster(name, "NAME")
        d = c.summary()
        d["groups"] = [
            {"device": g.device.id, "nodes": g.nodes, "devices_per_node": g.devices_per_node} for g in c.groups
        ]
        d["cross_link"] = {
            "efficiency": c.cross.efficiency,
            "latency_us": c.cross.latency_us,
            "bandwidth_GBps": c.cross.bandwidth_GBps,
            "assumption": c.cross.assumption,
        }
        d["sources"] = list(c.sources)
        if as_json:
            emit_json(d)
        else:
            render.console().print(render.kv_table(c.name, d))
        return
    rows = [cat.cluster(n).summary() for n in cat.cluster_names()]
    if as_json:
        emit_json(rows)
    else:
        render.console().print(render.clusters_table(rows))


def devices(
    name: Annotated[str | None, typer.Argument(help="Device id or path to a device table.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List device tables, or show one (with its provenance)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        dv = cat.device(name, "", "NAME")
        d = dv.summary()
        d["origin"] = dv.origin
        d["sources"] = list(dv.sources)
        d["assumptions"] = list(dv.assumptions)
        if dv.profiled:
            d["profiled"] = dict(dv.profiled)
        d["runtime"] = {k: {"value": v, "basis": dv.runtime_basis(k)} for k, v in dv.runtime.to_dict().items()}
        if dv.calibration:
            d["calibration"] = {k: v for k, v in dv.calibration.items() if k != "runs"} | {
                "runs": [r.get("id") for r in dv.calibration.get("runs", [])]
            }
        if as_json:
            emit_json(d)
        else:
            render.console().print(render.kv_table(f"{dv.id} ({dv.provenance})", d))
        return
    rows = [cat.device(n).summary() for n in cat.device_names()]
    if as_json:
        emit_json(rows)
    else:
        render.console().print(render.devices_table(rows))
