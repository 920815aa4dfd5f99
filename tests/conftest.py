"""Shared fixtures: an isolated HALAMAN_HOME, the embedded default model, tiny random models."""

from __future__ import annotations

import os
from pathlib import Path

import keyring
import keyring.backend
import keyring.errors
import pytest

REPO = Path(__file__).resolve().parent.parent
# The test corpus (not in the repository; what it holds: docs/CORPUS.md): $HALAMAN_CORPUS if set;
# else ../shared/corpus beside the checkout; else the team machine's copy (a clone elsewhere, e.g.
# CI's clean clone under /tmp).
CORPUS = Path(os.environ["HALAMAN_CORPUS"]) if os.environ.get("HALAMAN_CORPUS") else REPO.parent / "shared" / "corpus"
if not CORPUS.is_dir() and not os.environ.get("HALAMAN_CORPUS"):
    CORPUS = Path("/work/shared/corpus")

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
    """The embedded default model (SmolLM2-135M-Instruct) with float32 weights, on the CPU.

    Not the CPU's default (int4, `engine.models.int4_cpu`): its kernel rounds activations and
    outputs to bfloat16, so two runs whose inputs differ in the last bits (a float16 KV cache
    against transformers' float32 one) drift apart by up to 1.2 in a logit, which would hide what
    the cache tests measure. tests/test_weights_int4.py checks int4 against this model."""
    from engine.models.loader import load_model

    return load_model("default", device="cpu", weights="full")


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A real keyring backend that keeps passwords in a dict (no files, no OS service)."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.passwords.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.passwords[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.passwords.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError(username)


@pytest.fixture
def memory_keyring():
    """A MemoryKeyring installed as the keyring for one test."""
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)
