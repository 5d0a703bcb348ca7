"""Where catalog entries live and how names, paths and inline forms resolve to specs.

A :class:`Catalog` is a value, not a global: the CLI builds one from its options (``--devices-dir``)
and passes it down, so tests can point at their own folders.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path

from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.cluster import INLINE_RE, ClusterSpec, cluster_from_dict, parse_inline
from hapmoe_milp.specs.device import DeviceSpec, device_from_dict
from hapmoe_milp.specs.loader import load_model_file
from hapmoe_milp.specs.model import ModelSpec

ENV_ROOT = "HAPMOE_CATALOG"


def default_root() -> Path:
    """The project checkout (editable install) or the folder named by $HAPMOE_CATALOG."""
    env = os.environ.get(ENV_ROOT)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2]


def _is_file(p: str | Path) -> bool:
    try:
        return Path(p).is_file()
    except (OSError, ValueError):
        return False


def _looks_like_path(s: str) -> bool:
    return "/" in s or os.sep in s or s.endswith((".yaml", ".yml", ".json"))


@dataclass(frozen=True)
class Catalog:
    """Device tables resolve in order: ``devices_dirs`` (e.g. profiled), then the calibrated tables
    (``clusters/devices-calibrated``, unless ``use_calibrated`` is off), then the shipped ones."""

    root: Path = field(default_factory=default_root)
    devices_dirs: tuple[Path, ...] = ()
    use_calibrated: bool = True

    def __post_init__(self) -> None:
        # an extra folder is searched first: a typo in its name must not silently fall back to the shipped tables
        for d in self.devices_dirs:
            try:
                ok, exists = Path(d).is_dir(), Path(d).exists()
            except (OSError, ValueError):
                ok, exists = False, False
            if not ok:
                what = "is not a folder" if exists else "no such folder"
                raise SpecError(f"{d}: {what} (a folder of device tables)", field="devices_dirs")

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def clusters_dir(self) -> Path:
        return self.root / "clusters"

    @property
    def calibrated_dir(self) -> Path:
        return self.root / "clusters" / "devices-calibrated"

    @property
    def device_search_path(self) -> tuple[Path, ...]:
        calibrated = (self.calibrated_dir,) if self.use_calibrated else ()
        return (*self.devices_dirs, *calibrated, self.root / "clusters" / "devices")

    # ------------------------------------------------------------------ listing
    @staticmethod
    def _names(d: Path) -> list[str]:
        if not d.is_dir():
            return []
        return sorted(p.stem for p in d.glob("*.yaml") if not p.name.startswith("_") and _is_file(p))

    def model_names(self) -> list[str]:
        return self._names(self.models_dir)

    def cluster_names(self) -> list[str]:
        return self._names(self.clusters_dir)

    def device_names(self) -> list[str]:
        names: list[str] = []
        for d in self.device_search_path:
            for n in self._names(d):
                if n not in names:
                    names.append(n)
        return sorted(names)

    @staticmethod
    def _unknown(
        kind: str, name: str, known: list[str], source: str | None = None, fld: str | None = None
    ) -> SpecError:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}" if known else ""
        return SpecError(f"unknown {kind} {name!r}{hint}", source=source, field=fld)

    # ------------------------------------------------------------------ resolution
    def model(self, ref: str) -> ModelSpec:
        if _looks_like_path(ref) or _is_file(ref):
            return load_model_file(ref)
        p = self.models_dir / f"{ref.lower()}.yaml"
        if not _is_file(p):
            raise self._unknown("model", ref, self.model_names(), fld="model")
        return load_model_file(p)

    def device(self, ref: str, source: str = "", fld: str = "") -> DeviceSpec:
        if _looks_like_path(ref):
            return device_from_dict(load_document(ref), ref)
        for d in self.device_search_path:
            p = d / f"{ref.lower()}.yaml"
            if _is_file(p):
                dev = device_from_dict(load_document(p), str(p))
                if dev.id != ref.lower():
                    raise SpecError(f"file defines id {dev.id!r}, expected {ref.lower()!r}", source=str(p), field="id")
                return dev
        raise self._unknown("device", ref, self.device_names(), source or None, fld or None)

    def cluster(self, ref: str) -> ClusterSpec:
        if INLINE_RE.match(ref) and not _is_file(ref):
            return parse_inline(ref, self.device)
        if _looks_like_path(ref) or _is_file(ref):
            return cluster_from_dict(load_document(ref), ref, self.device)
        p = self.clusters_dir / f"{ref.lower()}.yaml"
        if not _is_file(p):
            raise self._unknown("cluster", ref, self.cluster_names(), fld="cluster")
        return cluster_from_dict(load_document(p), str(p), self.device)
