"""Shared fixtures: the embedded target, loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def target():
    """The embedded SmolLM2-135M-Instruct target in float32."""
    from engine import load_target

    return load_target()
