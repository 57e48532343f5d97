"""Shared fixtures of the framework suites (scripts/framework-tests.sh runs them in build/peer-venv)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261224)
