"""Writing results: strict JSON, atomic files, output paths checked before the work that fills them.

A plan or launch file is something people run on a thousand GPUs, so a write either completes or leaves
the previous file as it was: every file is written to a temporary name next to its target, flushed and
fsynced, then renamed over it (``os.replace`` is atomic on POSIX). An export writes all its files to
temporary names first and renames them only when all were written, so a failed export (disk full,
permission, interrupt) leaves the previous export intact rather than a cut-off plan next to stale scripts.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hapmoe_milp.errors import HapmoeError


class OutputError(HapmoeError):
    """An output path cannot be written (missing folder, a directory where a file goes, no permission)."""


def clean_json(v: Any) -> Any:
    """A copy that strict JSON can hold: NaN and infinities become null, tuples lists, keys strings."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): clean_json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [clean_json(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    return v


def dumps(obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """JSON that every parser accepts: never NaN/Infinity (``allow_nan=False`` after :func:`clean_json`)."""
    return json.dumps(clean_json(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


# ---------------------------------------------------------------------- stdout carries only the answer
@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr while libraries run (HiGHS, CBC and OR-Tools print banners and
    logs from C code, which no Python-level redirect catches), so stdout carries only the answer. The CLI
    wraps long work in it; the MILP backend wraps HiGHS's set-up, which prints before any flag can stop it."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no real fd 1 (embedded use): nothing to guard
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# ---------------------------------------------------------------------- checking paths before the work
def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    return q


def check_output_file(path: str | Path, field: str) -> Path:
    """An output file we can create or replace: its folder exists and is writable, it is not a folder.

    Called before a solve, so a typo in ``--out`` costs a second, not the whole search."""
    p = Path(path)
    try:
        if p.is_dir():
            raise OutputError("is a directory; give a file name", source=str(p), field=field)
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.exists():
            raise OutputError(f"folder {parent} does not exist", source=str(p), field=field)
        if not parent.is_dir():
            raise OutputError(f"{parent} is not a folder", source=str(p), field=field)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"folder {parent} is not writable", source=str(p), field=field)
        if p.exists() and not os.access(p, os.W_OK):
            raise OutputError("exists and is not writable", source=str(p), field=field)
        check_regular(p, field)
    except (OSError, ValueError) as exc:
        raise OutputError(f"not a usable path: {exc}", source=str(p), field=field) from None
    return p


def check_regular(path: str | Path, field: str) -> None:
    """An existing output must be a regular file: writing a plan "atomically" over a FIFO, a socket or a
    device (``/dev/full``, ``/dev/stdout``) would replace the special file itself with ours."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise OutputError(f"not a usable path: {exc}", source=str(p), field=field) from None
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise OutputError(
            "is not a regular file (a device, FIFO or socket); give a file name", source=str(p), field=field
        )


def check_output_dir(path: str | Path, field: str) -> Path:
    """An output folder we can create (with its parents) or write into; not an existing file."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise OutputError("exists and is not a folder", source=str(p), field=field)
        base = _nearest_existing(p)
        if not base.is_dir():
            raise OutputError(f"{base} is a file, not a folder", source=str(p), field=field)
        if not os.access(base, os.W_OK | os.X_OK):
            raise OutputError(f"{base} is not writable", source=str(p), field=field)
    except (OSError, ValueError) as exc:
        raise OutputError(f"not a usable path: {exc}", source=str(p), field=field) from None
    return p


# ---------------------------------------------------------------------- atomic writes
def _write_temp(folder: Path, name: str, data: bytes, mode: int) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n <= 0:  # pragma: no cover - os.write raises rather than return 0
                raise OSError("short write")
            view = view[n:]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return Path(tmp)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_text_atomic(path: str | Path, text: str, *, field: str = "path", executable: bool = False) -> Path:
    """Write ``text`` to ``path`` all or nothing (temp file in the same folder, fsync, rename)."""
    p = Path(path)
    mode = 0o755 if executable else 0o644
    try:
        tmp = _write_temp(p.parent if str(p.parent) else Path("."), p.name, text.encode("utf-8"), mode)
        try:
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", source=str(p), field=field) from None
    _fsync_dir(p.parent if str(p.parent) else Path("."))
    return p


def write_files_atomic(
    folder: str | Path,
    files: Mapping[str, str],
    *,
    executable: Iterable[str] = (),
    remove: Iterable[Path] = (),
    field: str = "folder",
) -> list[Path]:
    """Write several files into ``folder`` so that either all of them replace their previous versions or
    none does: every file goes to a temporary name first; only when all are written and fsynced are they
    renamed into place, and only then are the ``remove`` paths (stale files of a previous export) deleted."""
    out = Path(folder)
    exe = set(executable)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder: {exc.strerror or exc}", source=str(out), field=field) from None
    for name in files:
        if (out / name).is_dir():
            raise OutputError(
                f"{name} is a folder; remove it first (nothing was written)", source=str(out), field=field
            )
    staged: list[tuple[Path, Path]] = []
    try:
        for name, text in files.items():
            tmp = _write_temp(out, name, text.encode("utf-8"), 0o755 if name in exe else 0o644)
            staged.append((tmp, out / name))
    except BaseException as exc:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(
                f"cannot write (the previous files are unchanged): {exc.strerror or exc}", source=str(out), field=field
            ) from None
        raise
    try:
        for tmp, dst in staged:
            os.replace(tmp, dst)
    except OSError as exc:  # pragma: no cover - a rename inside one folder fails only on a vanished folder
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise OutputError(f"cannot rename into place: {exc.strerror or exc}", source=str(out), field=field) from None
    keep = {dst for _, dst in staged}
    for p in remove:
        if p not in keep:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    _fsync_dir(out)
    return [dst for _, dst in staged]
