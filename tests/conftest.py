"""Shared fixtures: an isolated HALAMAN_HOME, the embedded default model, tiny random models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"
if not CORPUS.is_dir():  # a clone elsewhere: CI points at the corpus explicitly
    CORPUS = Path(os.environ.get("HALAMAN_CORPUS", "/work/shared/corpus"))

# One home for the whole run, kept between runs under .pytest_cache so the GGUF conversion of the
# default model (~15-40 s) is paid once per machine; tests that need a private store or settings
# file use tmp_path on top of it.
os.environ.setdefault("HALAMAN_HOME", str(REPO / ".pytest_cache" / "halaman-home"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"corpus not found at {CORPUS}; set HALAMAN_CORPUS")
    return CORPUS


@pytest.fixture(scope="session")
def smol():
    """The embedded default model (SmolLM2-135M-Instruct), 4-bit weights, on the CPU."""
    from engine.models.loader import load_model

    return load_model("default", device="cpu")
