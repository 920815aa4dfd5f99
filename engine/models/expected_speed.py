"""How fast a model of the list would read and answer on this machine, before it is downloaded, and
which one to recommend here (Settings › Model: LM Studio and Jan say "may be slow on your device";
every row here said "Fits: yes").

Both rates scale from what was measured (docs/BENCHMARKS.md §5f, §5g: 2 cores without AVX-512,
int4 weights):

- answering (decode): a step costs a fixed part (the small operations of 30 layers' attention and
  bookkeeping, `STEP_FIXED_MS`) plus a part proportional to the weights a step multiplies: every
  linear layer and the LM head (`STEP_MS_PER_MILLION`). The embedded 135M model decodes 24 tokens/s,
  a 1.5B shape 6.3: those two points give both constants;
- reading (prefill): `engine.read_time.guessed_rate`, the measured whole-read rate of the embedded
  model scaled by the parameters a token passes through.

Both are multiplied by this machine's factor: a read measured here (`engine.read_time`'s file) of a
model whose size is known, against the guess for it; 1 when nothing was measured yet, and the
estimate then says it is a guess. A GPU is not estimated (`None`): nothing was measured on one.

Torch-free: the settings dialog uses it before any model is loaded.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from engine import read_time
from engine.models.catalog import CatalogModel

STEP_FIXED_MS = 29.2
"""Milliseconds of a decode step that do not grow with the model (24 tok/s for 134 M step parameters
and 6.31 tok/s for 1,385 M on the same CPU: t = 29.2 ms + 0.0934 ms per million)."""
STEP_MS_PER_MILLION = 0.0934
"""Milliseconds per million parameters a decode step multiplies (int4 layers, 8-bit LM head)."""
RECOMMENDED_ANSWER_TOKENS_PER_S = 5.0
"""The slowest answering a recommended model may have: below it a sentence takes several seconds."""


@dataclass(frozen=True)
class ExpectedSpeed:
    """Estimated rates of a model on this machine. read_tokens_per_s: prefill of a whole document;
    answer_tokens_per_s: decode; measured: scaled from a read measured here (False: the reference
    machine's rates, a guess)."""

    read_tokens_per_s: float
    answer_tokens_per_s: float
    measured: bool

    def describe(self) -> str:
        """'reads ~140 tokens/s, answers ~21 tokens/s (from this computer's reads)'."""
        source = "from this computer's reads" if self.measured else "a guess until a document is read here"
        return (f"reads ~{self.read_tokens_per_s:,.0f} tokens/s, answers ~{self.answer_tokens_per_s:,.1f} tokens/s "
                f"({source})")


def step_parameters(model: CatalogModel) -> int:
    """Parameters a decode step multiplies: every linear layer of the decoder layers and the LM
    head (vocabulary × hidden); the embedding lookup costs nothing."""
    return model.linear_parameters + model.vocab_size * model.hidden_size


def token_parameters(model: CatalogModel) -> int:
    """Parameters outside the embeddings, what a token's prefill compute scales with
    (`engine.read_time.guessed_rate`)."""
    return model.linear_parameters


def machine_factor(models: list[CatalogModel], device: str, path: Path | None = None) -> float | None:
    """This machine's speed against the reference: the median, over reads measured here on
    `device` of models in `models` (by their hub repository or the embedded model's label), of the
    measured rate ÷ `read_time.guessed_rate` for that model. None when none was measured."""
    sizes = {model.repo: token_parameters(model) for model in models}
    embedded = next((model for model in models if model.embedded), None)
    if embedded is not None:
        from engine.models.source import resolve

        sizes[resolve("default").label] = token_parameters(embedded)
    ratios = [rate / read_time.guessed_rate(device, sizes[key.model])
              for key, rate in read_time.measured_rates(path).items() if key.device == device and key.model in sizes]
    return statistics.median(ratios) if ratios else None


def expected_speed(model: CatalogModel, device: str, factor: float | None) -> ExpectedSpeed | None:
    """`model`'s rates on `device` with this machine's `factor` (`machine_factor`; None: a guess
    at the reference machine's). None on a GPU: not estimated."""
    if device != "cpu":
        return None
    scale = factor if factor is not None else 1.0
    read = read_time.guessed_rate(device, token_parameters(model)) * scale
    step_ms = STEP_FIXED_MS + STEP_MS_PER_MILLION * step_parameters(model) / 1e6
    return ExpectedSpeed(read, 1000.0 / step_ms * scale, factor is not None)


def recommended(models: list[CatalogModel], speeds: list[ExpectedSpeed | None], fits: list[bool]) -> int | None:
    """The index of the model to recommend here: the largest (by the parameters a token passes
    through) that fits and answers at least
    `RECOMMENDED_ANSWER_TOKENS_PER_S`; on a GPU (no estimate) the largest that fits; else the
    embedded model's; None when the list holds none of these."""
    def good(i: int) -> bool:
        return fits[i] and (speeds[i] is None or speeds[i].answer_tokens_per_s >= RECOMMENDED_ANSWER_TOKENS_PER_S)

    candidates = [i for i in range(len(models)) if good(i)]
    if candidates:
        return max(candidates, key=lambda i: models[i].linear_parameters)
    return next((i for i, model in enumerate(models) if model.embedded), None)


__all__ = ["ExpectedSpeed", "expected_speed", "machine_factor", "recommended", "step_parameters"]
