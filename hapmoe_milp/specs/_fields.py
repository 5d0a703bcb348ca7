"""Strict readers for YAML/JSON documents.

Every accessor takes the document's source name and a dotted field path so that errors read
``models/foo.yaml: moe_router_topk: must be a positive integer, got -1``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import reprlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hapmoe_milp.errors import SpecError
from hapmoe_milp.limits import MAX_SPEC_INT, SAFE_NAME_PATTERN, SPEC_INT_CAPS

_MISSING = object()

MAX_FILE_BYTES = 16 << 20  # a spec, plan or preset file larger than this is not one
MAX_DOCUMENT_VALUES = 1_000_000  # values a document may expand to (YAML aliases share, they do not copy)
MAX_DOCUMENT_DEPTH = 64  # nesting levels; the deepest real spec (a cluster's device tables) has 6


def show(v: Any, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters: an error message quotes the bad value, never megabytes of it
    (a YAML alias bomb is small on disk and huge when printed)."""
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlist, r.maxdict = 3, limit, limit, 6, 6
    try:
        text = r.repr(v)
    except Exception:  # a value whose repr fails is still reported
        text = f"<{type(v).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SafeBase: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when built with it: ~10x faster


class _StrictLoader(_SafeBase):  # type: ignore[misc,valid-type]
    """``yaml.safe_load`` that refuses duplicate keys (YAML's "last one wins" hides typos)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    continue  # unhashable: the base class reports it
                if dup:
                    mark = key_node.start_mark
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {show(key)}", mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


# YAML 1.1 (PyYAML) reads ``1e-4`` and ``3e9`` as strings: its floats need a dot. YAML 1.2 and every JSON
# parser read them as numbers, and so do people writing a gap or a bandwidth; so do we.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def _strict_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {show(k)}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (use a finite number or null)")


def strict_json_loads(text: str) -> Any:
    """``json.loads`` that refuses duplicate keys and NaN/Infinity, as the JSON standard does."""
    return json.loads(text, object_pairs_hook=_strict_pairs, parse_constant=_no_constant)


def python_json_loads(text: str) -> tuple[Any, list[str]]:
    """``json.loads`` as Python (and so Hugging Face transformers) reads and writes JSON: ``NaN``,
    ``Infinity`` and ``-Infinity`` are numbers (Nemotron-H's ``"time_step_limit": [0.0, Infinity]``).
    Duplicate keys are still refused. Returns the document and the constants it held, so a caller can
    refuse them where its format does not allow them."""
    seen: list[str] = []

    def constant(name: str) -> float:
        seen.append(name)
        return float(name.replace("Infinity", "inf"))

    return json.loads(text, object_pairs_hook=_strict_pairs, parse_constant=constant), seen


def is_hf_config(doc: Any) -> bool:
    """A Hugging Face ``config.json`` (transformers writes ``model_type`` and usually ``architectures``)."""
    return isinstance(doc, dict) and ("model_type" in doc or "architectures" in doc)


def _document_shape(doc: Any) -> tuple[int, int]:
    """(values once aliases are expanded, nesting depth) of a parsed document, walked without recursion.

    Python's stack is the limit a hostile document hits first: a YAML parser on one platform refuses
    5,000 nested lists, on another it builds them; a recursive walk would then crash the checker itself.
    Shared sub-trees count once per use (an alias bomb is small on disk and huge expanded); a recursive
    alias (YAML builds such cycles) counts once. The walk stops early once either limit is passed."""
    if not isinstance(doc, dict | list):
        return 1, 0
    memo: dict[int, tuple[int, int]] = {id(doc): (1, 1)}
    # a frame: [container, its remaining children, values so far, height so far]
    stack: list[list[Any]] = [[doc, iter(doc.values() if isinstance(doc, dict) else doc), 1, 1]]
    while True:
        frame = stack[-1]
        child = next(frame[1], _MISSING) if frame[2] <= MAX_DOCUMENT_VALUES else _MISSING
        if child is _MISSING:
            stack.pop()
            memo[id(frame[0])] = (frame[2], frame[3])
            if not stack:
                return frame[2], frame[3]
            stack[-1][2] += frame[2]
            stack[-1][3] = max(stack[-1][3], frame[3] + 1)
        elif not isinstance(child, dict | list):
            frame[2] += 1
        elif id(child) in memo:
            values, height = memo[id(child)]
            frame[2] += values
            frame[3] = max(frame[3], height + 1)
            if len(stack) + height > MAX_DOCUMENT_DEPTH:
                return frame[2], len(stack) + height
        elif len(stack) >= MAX_DOCUMENT_DEPTH:
            return frame[2], len(stack) + 1
        else:
            memo[id(child)] = (1, 1)
            stack.append([child, iter(child.values() if isinstance(child, dict) else child), 1, 1])


def parse_text(text: str, source: str, kind: str) -> Any:
    """Parse YAML or JSON text strictly; every syntax problem becomes a one-line SpecError."""
    constants: list[str] = []
    try:
        if kind == "JSON":
            doc, constants = python_json_loads(text)
        else:
            doc = yaml.load(text, Loader=_StrictLoader)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
            first = exc.problem + (f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else "")
        raise SpecError(f"not valid {kind}: {first[:200]}", source=source) from None
    if constants and not is_hf_config(doc):
        # only Hugging Face configs are written by Python's json (which emits NaN/Infinity); our own
        # files are standard JSON, where they are a mistake
        raise SpecError(
            f"not valid JSON: {constants[0]} is not valid JSON (use a finite number or null)", source=source
        )
    values, depth = _document_shape(doc)
    if depth > MAX_DOCUMENT_DEPTH:
        raise SpecError(f"nests deeper than {MAX_DOCUMENT_DEPTH} levels; refusing it", source=source)
    if values > MAX_DOCUMENT_VALUES:
        raise SpecError(
            f"expands to more than {MAX_DOCUMENT_VALUES:,} values (YAML aliases); refusing it", source=source
        )
    return doc


def load_document(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping, turning every I/O or syntax problem into a SpecError."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError("file not found", source=str(p)) from None
    except IsADirectoryError:
        raise SpecError("is a directory, expected a file", source=str(p)) from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read: {exc}", source=str(p)) from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"is larger than {MAX_FILE_BYTES >> 20} MiB; not a spec, plan or preset file", source=str(p))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})", source=str(p)) from None
    doc = parse_text(text, str(p), "JSON" if p.suffix == ".json" else "YAML")
    if not isinstance(doc, dict):
        raise SpecError(f"expected a mapping at top level, got {type(doc).__name__}", source=str(p))
    return doc


def nesting(text: str, open_: str = "(", close: str = ")") -> int:
    """The deepest nesting of ``open_``/``close`` in ``text``, counted before any parser recurses into it (a
    recursive-descent parser meets Python's stack limit at a few hundred levels)."""
    depth = deepest = 0
    for ch in text:
        if ch == open_:
            depth += 1
            deepest = max(deepest, depth)
        elif ch == close:
            depth -= 1
    return deepest


_SAFE_NAME_RE = re.compile(SAFE_NAME_PATTERN)


def _show_int(v: int) -> str:
    """An integer for a message: digits up to 18 of them, else its magnitude (a 5,000-digit value is not
    printed, nor converted to text: Python refuses to above 4,300 digits)."""
    if abs(v) < 10**18:
        return str(v)
    return f"{'-' if v < 0 else ''}2^{abs(v).bit_length() - 1} or more"


def check_name(name: Any, source: str | None, fld: str) -> str:
    """A model, cluster or device name: it reaches generated launch files (comments, host names, YAML), so
    it is letters, digits and ``._+-`` only -- no spaces, quotes, ``$`` or newlines to inject with."""
    if not isinstance(name, str) or not _SAFE_NAME_RE.fullmatch(name):
        raise SpecError(
            f"{show(name)} is not a safe name (letters, digits and . _ + - only, starting with a letter or digit, "
            "at most 128 characters)",
            source=source,
            field=fld,
        )
    return name


def spec_hash(doc: Any) -> str:
    """Content hash of a spec: sha256 of its canonical JSON (sorted keys), first 16 hex digits."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


_KEY_RE = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,80}")


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
        k = key if isinstance(key, str) and _KEY_RE.fullmatch(key) else show(key, 40)
        return f"{self.prefix}.{k}" if self.prefix else k

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
            raise self.err(key, f"must be true or false, got {show(v)}")
        return v

    def int_(self, key: str, default: Any = _MISSING, *, minimum: int | None = 1, maximum: int | None = None) -> Any:
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise self.err(key, f"must be an integer, got {show(v)}")
        if minimum is not None and v < minimum:
            word = "positive" if minimum == 1 else "0 or positive" if minimum == 0 else f">= {minimum}"
            raise self.err(key, f"must be {word}, got {_show_int(v)}")
        # a cap by name (limits.SPEC_INT_CAPS: Megatron's and Hugging Face's names alike), else the generic one
        cap = maximum if maximum is not None else SPEC_INT_CAPS.get(key, MAX_SPEC_INT)
        if v > cap:
            raise self.err(key, f"{_show_int(v)} exceeds the supported maximum of {cap:,}")
        if minimum is None and v < -MAX_SPEC_INT:
            raise self.err(key, f"{_show_int(v)} is below the supported minimum of {-MAX_SPEC_INT:,}")
        return v

    def float_(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        positive: bool = True,
        allow_zero: bool = False,
        within: tuple[float, float] | None = None,
        unit: str = "",
    ) -> Any:
        """A finite number; ``within=(lo, hi)`` is its physical range (limits.RANGE_*), inclusive.

        Denormal numbers (0 < |v| < 2.2e-308) are refused everywhere: no physical input is one, and they
        turn into infinities or zeros at the first division."""
        v = self.raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(key, f"must be a number, got {show(v)}")
        try:
            v = float(v)
        except OverflowError:
            v = math.inf
        if not math.isfinite(v):
            raise self.err(key, f"must be finite, got {v}")
        if v != 0 and abs(v) < sys.float_info.min:
            raise self.err(key, f"{v:g} is a denormal number, not a physical value")
        if positive and (v < 0 or (v == 0 and not allow_zero)):
            raise self.err(key, f"must be {'non-negative' if allow_zero else 'positive'}, got {v:g}")
        if within is not None and not within[0] <= v <= within[1]:
            u = f" {unit}" if unit else ""
            raise self.err(key, f"{v:g}{u} is outside the physical range [{within[0]:g}, {within[1]:g}]{u}")
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
        if v is default and default is not _MISSING:
            return v
        if v not in choices:
            raise self.err(key, f"must be one of {', '.join(choices)}, got {show(v)}")
        return v

    def reject_unknown(self, allowed_extra: Sequence[str] = ()) -> None:
        unknown = sorted(set(map(str, self.doc)) - self._seen - set(allowed_extra))
        if unknown:
            raise self.err(unknown[0], "unknown field" + (f" (also: {show(unknown[1:], 80)})" if unknown[1:] else ""))
