"""Shared fixtures: the shipped catalog (helper functions live in tests/helpers.py)."""

from __future__ import annotations

import pytest

from hapmoe_milp.specs import Catalog

try:  # property tests draw the same examples on every run: a CI run's time and outcome do not depend on luck
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass
else:
    _hypothesis_settings.register_profile("deterministic", derandomize=True)
    _hypothesis_settings.load_profile("deterministic")


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog()
