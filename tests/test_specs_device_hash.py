"""A device table's content hash does not depend on where its file lives: a plan solved in one checkout
records the same cluster hash as in another (the tables name their file only for error messages)."""

from __future__ import annotations

import shutil
from pathlib import Path

from hapmoe_milp.specs.cluster import device_hash
from hapmoe_milp.specs.device import load_device_file


def test_the_same_table_in_two_folders_hashes_alike(catalog, tmp_path):
    src = catalog.device("h100").origin
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    shutil.copy(src, a / "h100.yaml")
    shutil.copy(src, b / "h100.yaml")
    da, db = load_device_file(a / "h100.yaml"), load_device_file(b / "h100.yaml")
    assert da.origin != db.origin
    assert device_hash(da) == device_hash(db)


def test_a_changed_number_changes_the_hash(catalog, tmp_path):
    src = catalog.device("h100").origin
    text = Path(src).read_text(encoding="utf-8")
    (tmp_path / "h100.yaml").write_text(text, encoding="utf-8")
    base = device_hash(load_device_file(tmp_path / "h100.yaml"))
    assert "peak_tflops" in text or "memory_gib" in text
    key = "memory_gib:" if "memory_gib:" in text else "peak_tflops:"
    head, rest = text.split(key, 1)
    value, tail = rest.split("\n", 1)
    (tmp_path / "h100.yaml").write_text(f"{head}{key} {float(value.split('#')[0]) * 0.5}\n{tail}", encoding="utf-8")
    assert device_hash(load_device_file(tmp_path / "h100.yaml")) != base
