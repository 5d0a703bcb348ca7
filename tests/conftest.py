"""Shared fixtures: the shipped catalog (helper functions live in tests/helpers.py)."""

from __future__ import annotations

import pytest

from hapmoe_milp.specs import Catalog


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog()
