"""Strict readers for YAML/JSON documents.

Every accessor takes the document's source name and a dotted field path so that errors read
``models/foo.yaml: moe_router_topk: must be a positive integer, got -1``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hapmoe_milp.errors import SpecError

_MISSING = object()


def load_document(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping, turning every I/O or syntax problem into a SpecError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("file not found", source=str(p)) from None
    except IsADirectoryError:
        raise SpecError("is a directory, expected a file", source=str(p)) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecError(f"cannot read: {exc}", source=str(p)) from None
    try:
        if p.suffix == ".json":
            doc = json.loads(text)
        else:
            doc = yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {msg}", source=str(p)) from None
    if not isinstance(doc, dict):
        raise SpecError(f"expected a mapping at top level, got {type(doc).__name__}", source=str(p))
    return doc


class Fields:
    """A view of one mapping that records which keys were read, to reject unknown ones."""

    def __init__(self, doc: Any, source: str, prefix: str = "") -> None:
        if not isinstance(doc, Mapping):
            raise SpecError(f"expected a mapping, got {type(doc).__name__}", source=source, field=prefix or None)
        self.doc = doc
        self.source = source
        self.prefix = prefix
        self._seen: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def err(self, key: str, msg: str) -> SpecError:
        return SpecError(msg, source=self.source, field=self.path(key))

    def has(self, key: str) -> bool:
        return key in self.doc and self.doc[key] is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._seen.add(key)
        if key not in self.doc or self.doc[key] is None:
            if default is _MISSING:
                raise self.err(key, "required field is missing")
            return default
        return self.doc[key]

    def str_(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise self.err(key, f"must be a string, got {type(v).__name__}")
        return str(v)

    def bool_(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, bool):
            raise self.err(key, f"must be true or false, got {v!r}")
        return v

    def int_(self, key: str, default: Any = _MISSING, *, minimum: int | None = 1) -> Any:
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise self.err(key, f"must be an integer, got {v!r}")
        if minimum is not None and v < minimum:
            word = "positive" if minimum == 1 else "0 or positive" if minimum == 0 else f">= {minimum}"
            raise self.err(key, f"must be {word}, got {v}")
        return v

    def float_(self, key: str, default: Any = _MISSING, *, positive: bool = True, allow_zero: bool = False) -> Any:
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(key, f"must be a number, got {v!r}")
        v = float(v)
        if not math.isfinite(v):
            raise self.err(key, f"must be finite, got {v}")
        if positive and (v < 0 or (v == 0 and not allow_zero)):
            raise self.err(key, f"must be {'non-negative' if allow_zero else 'positive'}, got {v:g}")
        return v

    def list_(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, Sequence) or isinstance(v, (str, bytes)):
            raise self.err(key, f"must be a list, got {type(v).__name__}")
        return list(v)

    def sub(self, key: str, default: Any = _MISSING) -> Fields | None:
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return None if v is None else Fields(v, self.source, self.path(key))
        return Fields(v, self.source, self.path(key))

    def choice(self, key: str, choices: Sequence[str], default: Any = _MISSING) -> Any:
        v = self.str_(key, default)
        if v not in choices:
            raise self.err(key, f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    def reject_unknown(self, allowed_extra: Sequence[str] = ()) -> None:
        unknown = sorted(set(map(str, self.doc)) - self._seen - set(allowed_extra))
        if unknown:
            raise self.err(unknown[0], "unknown field" + (f" (also: {', '.join(unknown[1:])})" if unknown[1:] else ""))
