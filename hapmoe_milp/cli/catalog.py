"""Catalog commands: ``models``, ``clusters``, ``devices`` -- list the shipped specs or show one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from hapmoe_milp.cli.options import (
    STATE,
    JsonOpt,
    catalog_cluster,
    catalog_model,
)
from hapmoe_milp.cli.output import emit_json


def models(
    name: Annotated[str | None, typer.Argument(help="Catalog name or path (YAML or HF config.json).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the model catalog, or show one model (parameter counts, FLOPs per token)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        m = catalog_model(name, "NAME")
        d = m.describe()
        _answer(as_json, d, lambda: render.kv_table(m.name, d))
        return
    rows = [cat.model(n).summary() for n in cat.model_names()]
    _answer(as_json, rows, lambda: render.models_table(rows))


def clusters(
    name: Annotated[str | None, typer.Argument(help="Catalog name, path, or inline form like 8xh800+16x910b.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the cluster catalog, or show one cluster."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        c = catalog_cluster(name, "NAME")
        d = c.describe()
        _answer(as_json, d, lambda: render.kv_table(c.name, d))
        return
    rows = [cat.cluster(n).summary() for n in cat.cluster_names()]
    _answer(as_json, rows, lambda: render.clusters_table(rows))


def devices(
    name: Annotated[str | None, typer.Argument(help="Device id or path to a device table.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List device tables, or show one (with its provenance)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        dv = cat.device(name, "", "NAME")
        d = dv.describe()
        _answer(as_json, d, lambda: render.kv_table(f"{dv.id} ({dv.provenance})", d))
        return
    rows = [cat.device(n).summary() for n in cat.device_names()]
    _answer(as_json, rows, lambda: render.devices_table(rows))


def _answer(as_json: bool, value: Any, table: Callable[[], Any]) -> None:
    """The answer on stdout: strict JSON, or the rich table (built only when it is shown)."""
    if as_json:
        emit_json(value)
    else:
        from hapmoe_milp import render

        render.console().print(table())
