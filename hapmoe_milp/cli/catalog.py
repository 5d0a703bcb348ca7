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
    one = catalog_model(name, "NAME") if name else None
    _show_or_list(
        as_json, one, lambda m: m.name, lambda: [cat.model(n).summary() for n in cat.model_names()], render.models_table
    )


def clusters(
    name: Annotated[str | None, typer.Argument(help="Catalog name, path, or inline form like 8xh800+16x910b.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the cluster catalog, or show one cluster."""
    from hapmoe_milp import render

    cat = STATE.catalog
    one = catalog_cluster(name, "NAME") if name else None
    _show_or_list(
        as_json,
        one,
        lambda c: c.name,
        lambda: [cat.cluster(n).summary() for n in cat.cluster_names()],
        render.clusters_table,
    )


def devices(
    name: Annotated[str | None, typer.Argument(help="Device id or path to a device table.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List device tables, or show one (with its provenance)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    one = cat.device(name, "", "NAME") if name else None
    _show_or_list(
        as_json,
        one,
        lambda dv: f"{dv.id} ({dv.provenance})",
        lambda: [cat.device(n).summary() for n in cat.device_names()],
        render.devices_table,
    )


def _show_or_list(
    as_json: bool,
    one: Any,
    title: Callable[[Any], str],
    rows: Callable[[], list[dict[str, Any]]],
    table: Callable[[list[dict[str, Any]]], Any],
) -> None:
    """What every catalog command answers: the spec named (``one``: its description, titled ``title(one)``),
    or, without a name (``one`` None), every catalog entry's summary row in ``table``."""
    from hapmoe_milp import render

    if one is not None:
        d = one.describe()
        _answer(as_json, d, lambda: render.kv_table(title(one), d))
        return
    listed = rows()
    _answer(as_json, listed, lambda: table(listed))


def _answer(as_json: bool, value: Any, table: Callable[[], Any]) -> None:
    """The answer on stdout: strict JSON, or the rich table (built only when it is shown)."""
    if as_json:
        emit_json(value)
    else:
        from hapmoe_milp import render

        render.console().print(table())
