"""Progress of opening a document, for the window and the command line: what is happening
(`Phase`), how far it is (`Progress`) and how long is left (`PrefillClock`, steadied by
`steady_eta`). Torch-free: the window imports it without the model's libraries.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class Phase(enum.Enum):
    """What a `Progress` event reports: loading the model, reading the file(s), tokenizing,
    prefilling, or looking for / restoring a saved prefix cache. `value` is the name shown."""

    LOADING_MODEL = "loading model"
    READING = "reading"
    TOKENIZING = "tokenizing"
    PREFILL = "prefill"
    LOADING_CACHE = "loading cache"
    REREADING = "re-reading the chosen pages"  # an answer's chosen spans prefilled again before its first word


@dataclass(frozen=True)
class Progress:
    """A progress event of opening a document (or loading the model): `done` of `total` `unit`s."""

    phase: Phase
    done: int
    total: int
    unit: str                  # "pages", "files", "tokens"; "model" or CONVERTING_MODEL_UNIT
    tokens_per_s: float = 0.0
    eta_s: float | None = None


CONVERTING_MODEL_UNIT = "model, converted first"
"""The unit of a LOADING_MODEL `Progress` when the model is converted before it loads (a GGUF file's
first load): the window says so only then."""


def reading_progress(notify: Callable[[Progress], None], path: str | os.PathLike[str]) -> Callable[[int, int], None]:
    """`load_document`'s progress(done, total) for `path` as "reading" `Progress` events for
    `notify`: a folder counts files, a PDF pages."""
    unit = "files" if Path(path).is_dir() else "pages"
    return lambda done, total: notify(Progress(Phase.READING, done, total, unit))


class PrefillClock:
    """Turns the decoder's (done, total, elapsed seconds) into a prefill `Progress`.

    tokens_per_s is the average so far (what the report prints). The ETA follows the cost of chunked
    prefill instead of the average rate: a chunk attends to the kept cache plus itself, and the kept
    cache grows until it reaches the budget, so the time per token is about a + b·kept with
    kept = min(tokens before the chunk, budget). a and b are fitted (least squares) to the chunks
    seen so far and summed over the chunks to come. The average rate overestimated the rate to come
    (a fresh user saw "7 min left" stay put for minutes on a 9.7k-token PDF).

    The ETA shown is steadied (`steady_eta`): a chunk or two slowed by another program's load tilts
    the fit, and the time left used to leap (14 s, then 39 s, then 22 s) though the read went on
    at its rate.
    """

    def __init__(self, budget_tokens: int, start_tokens: int = 0) -> None:
        self.budget_tokens = budget_tokens
        self._start = start_tokens  # a read going on from there (paused, then resumed): `elapsed` counts from it
        self._last = (start_tokens, 0.0)
        self._chunks: list[tuple[int, float, float]] = []  # (tokens, seconds per token, kept before it)
        self._shown: float | None = None  # the ETA last shown, seconds
        self._rises = 0                   # updates in a row whose fitted ETA was above what `steady_eta` let show

    def __call__(self, done: int, total: int, elapsed: float) -> Progress:
        last_done, last_elapsed = self._last
        if done > last_done and elapsed > last_elapsed:
            self._chunks.append((done - last_done, (elapsed - last_elapsed) / (done - last_done),
                                 min(last_done, self.budget_tokens)))
            self._last = (done, elapsed)
        rate = (done - self._start) / elapsed if elapsed > 0 else 0.0
        fitted = self._eta(done, total)
        if fitted is not None:
            self._shown, self._rises = steady_eta(self._shown, fitted, self._rises)
        return Progress(Phase.PREFILL, done, total, "tokens", tokens_per_s=rate, eta_s=self._shown)

    def _eta(self, done: int, total: int) -> float | None:
        if not self._chunks:
            return None
        weights = [n for n, _, _ in self._chunks]
        mean_kept = sum(n * kept for n, _, kept in self._chunks) / sum(weights)
        mean_cost = sum(n * cost for n, cost, _ in self._chunks) / sum(weights)
        spread = sum(n * (kept - mean_kept) ** 2 for n, _, kept in self._chunks)
        slope = sum(n * (kept - mean_kept) * (cost - mean_cost) for n, cost, kept in self._chunks) / spread if spread else 0.0
        slope = max(slope, 0.0)  # a noisy fit must not predict that a fuller cache is cheaper
        intercept = mean_cost - slope * mean_kept
        if slope == 0.0 or intercept <= 0:  # one point or noise: the whole read's per-token cost, not a few chunks' under load
            slope, intercept = 0.0, mean_cost
        chunk = self._chunks[-1][0]
        seconds, position = 0.0, done
        while position < total:
            step = min(chunk, total - position)
            seconds += step * (intercept + slope * min(position, self.budget_tokens))
            position += step
        return seconds


ETA_RISE_MAX = 1.25
"""The shown time left may rise at most by this factor from one progress update to the next..."""
ETA_RISE_AFTER = 4
"""...unless the fitted time left was above that for this many updates in a row: the rate changed."""


def steady_eta(shown_s: float | None, fitted_s: float, rises: int) -> tuple[float, int]:
    """The time left to show, in seconds, and the new count of capped rises, from the time left
    shown last (`shown_s`, None at the first update), the one fitted now (`fitted_s`) and how many
    updates in a row were capped before (`rises`). A fall is shown as fitted; a rise is capped at
    `ETA_RISE_MAX` × the last shown until it has lasted `ETA_RISE_AFTER` updates. Raises nothing."""
    if shown_s is None or fitted_s <= shown_s * ETA_RISE_MAX:
        return fitted_s, 0
    rises += 1
    if rises >= ETA_RISE_AFTER:
        return fitted_s, 0
    return shown_s * ETA_RISE_MAX, rises
