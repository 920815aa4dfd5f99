"""How long reading a document will take on this machine, before the read starts.

A read (prefill) of a 520k-token code folder takes about an hour on two CPU cores; the user should
know that before it starts, not after. `plan_read` turns the exact token count into a `ReadPlan`
with the prefill rate measured here (this model, device, weights and CPU threads), or a guess when
no read has been measured yet. `DocumentSession.open` asks its `before_prefill` callback with the
plan when it is at least `LONG_READ_S`, and records the measured rate after each real prefill of
at least `MIN_MEASURED_TOKENS` tokens (`record_rate`).

The measured rates live in `<cache dir>/read_speed.json` (`engine.paths.cache_dir`): a cache, so a
damaged or unreadable file is ignored (the plan falls back to the guess) and a file that cannot be
written costs only the next plan's accuracy, never an error.

Torch-free: plain numbers in, plain numbers out.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine.cpu_load import others_busy_cores, usable_cores
from engine.units import format_duration

# A read planned to take at least this long (seconds) is a long read: the caller is asked first.
LONG_READ_S = 600.0
# Prefills shorter than this (tokens) are not recorded: their rate is dominated by fixed costs and
# by a cache that is not full yet, so they would promise a long read too much.
MIN_MEASURED_TOKENS = 2048
# Measurements kept per key; the plan uses their median. One read while another process shared
# the cores then does not set the next estimate alone,
# and a lasting change (a new machine load, a new build) takes over after two reads.
RATES_KEPT = 3
# Keys kept in the file, least recently measured dropped first (models x devices x weights x threads).
MAX_KEYS = 32
RATES_FILE = "read_speed.json"
_FORMAT = 1

# The guess when nothing is measured: whole-read prefill rates of the embedded SmolLM2-135M
# (tokens/s), scaled by the model's size. CPU: the whole-book rate of the float32 attention path that a
# CPU without AVX-512 BF16 takes, the slower of the two (the int4 path's is in docs/BENCHMARKS.md §5),
# so a read is more likely warned about than not.
# CUDA: not measured (BENCHMARKS has no GPU run); 2,000 is an assumption, on the low side for a
# model this small, so a GPU read is more likely warned about than not.
DEFAULT_TOKENS_PER_S = {"cpu": 144.0, "cuda": 2000.0}
# SmolLM2-135M's parameters outside the embeddings (30 layers of 576 x 1536; 134,515,008 in all):
# what each token's compute scales with, since an embedding lookup costs nothing.
REFERENCE_PARAMETERS = 106_203_456


@dataclass(frozen=True)
class RateKey:
    """What a prefill rate is measured for. model: the model's label; device: "cpu" or "cuda";
    weights: how they are held and read (`LoadedModel.reading_label`: "float32", "4-bit NF4",
    "4-bit int4, unpacked to bfloat16"); threads: CPU threads (0 on a GPU)."""

    model: str
    device: str
    weights: str
    threads: int


@dataclass(frozen=True)
class ReadPlan:
    """A read about to start. tokens: the document's exact prefix tokens; tokens_per_s: the prefill
    rate it is planned with; seconds: tokens / tokens_per_s; measured: the rate was measured on this
    machine for the same `RateKey` (False: a guess, `guessed_rate`)."""

    tokens: int
    tokens_per_s: float
    seconds: float
    measured: bool
    threads: int = 0   # CPU threads the rate is for (0: a GPU); rates are kept per thread count
    busy_share: float = 1.0  # a guess's share of the idle rate left by other programs now (`cpu_share`)

    @property
    def is_long(self) -> bool:
        """At least `LONG_READ_S`: long enough to ask before starting."""
        return self.seconds >= LONG_READ_S

    def describe(self) -> str:
        """One line: '520,143 tokens: about 1 h 00 min on this computer (144 tokens/s measured here)'."""
        rate = f"{self.tokens_per_s:,.0f}" if self.tokens_per_s >= 10 else f"{self.tokens_per_s:.1f}"  # never "0"
        source = (f"{rate} tokens/s measured here" if self.measured
                  else "a guess: no read of this model measured yet on this computer"
                  + (f" with {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else "")
                  + (f"; other programs are using the processor now: about {1 / self.busy_share:.1f}× longer"
                     if self.busy_share < 1 else ""))
        return f"{self.tokens:,} tokens: about {format_duration(self.seconds)} on this computer ({source})"


def rates_path() -> Path:
    """The measured rates: `<cache dir>/read_speed.json`."""
    return paths.cache_dir() / RATES_FILE


def guessed_rate(device: str, parameters: int) -> float:
    """Prefill tokens/s guessed for a model with `parameters` parameters outside its embeddings (0:
    unknown, taken as the embedded model's) on `device` ("cpu", "cuda"; another type gets the CPU's
    rate, the slower guess): `DEFAULT_TOKENS_PER_S` x REFERENCE_PARAMETERS / parameters. The CPU
    figure was measured with 2 threads; the first measured read replaces the guess."""
    base = DEFAULT_TOKENS_PER_S.get(device, DEFAULT_TOKENS_PER_S["cpu"])
    return base * REFERENCE_PARAMETERS / parameters if parameters > 0 else base


def measured_rate(key: RateKey, path: Path | None = None) -> float | None:
    """The median of the rates recorded for `key` (tokens/s), None when none is (or the file is
    missing or damaged). path: default `rates_path()`."""
    try:
        rates = _load(path or rates_path()).get(key)
    except OSError:  # the cache dir cannot be created
        return None
    return statistics.median(rates) if rates else None


def measured_rates(path: Path | None = None) -> dict[RateKey, float]:
    """Every key with a rate recorded here and its median (tokens/s); {} when none is (or the
    file is missing or damaged). path: default `rates_path()`."""
    try:
        rates = _load(path or rates_path())
    except OSError:  # the cache dir cannot be created
        return {}
    return {key: statistics.median(values) for key, values in rates.items()}


def cpu_share(threads: int, others_cores: float, cores: int) -> float:
    """The share of an idle machine's rate that `threads` CPU threads get while other programs keep
    `others_cores` cores busy on a machine of `cores`: 1 while they all fit, else
    cores / (others_cores + threads), the scheduler's fair share. A GPU read (threads 0): 1. Pure."""
    if threads <= 0:
        return 1.0
    wanted = max(0.0, others_cores) + threads
    return 1.0 if wanted <= cores else cores / wanted


def plan_read(tokens: int, key: RateKey, parameters: int, path: Path | None = None, *,
              others_cores: float | None = None) -> ReadPlan:
    """The plan for prefilling `tokens` tokens: at the rate measured for `key`, else at
    `guessed_rate(key.device, parameters)` times the share of the processor other programs leave
    now (`cpu_share` with `others_cores`, the cores they keep busy; None: measured now, a quarter
    of a second, `engine.cpu_load.others_busy_cores`). A measured rate was measured under this
    machine's usual load already; the guess is an idle machine's, and on a busy one the first plan
    said "about 1 h" for a read of 7 h 38 min."""
    rate = measured_rate(key, path)
    measured, share = rate is not None, 1.0
    if rate is None:
        if key.device == "cpu":
            busy = others_busy_cores() if others_cores is None else others_cores
            share = cpu_share(key.threads, busy, usable_cores())
        rate = guessed_rate(key.device, parameters) * share
    return ReadPlan(tokens=tokens, tokens_per_s=rate, seconds=tokens / rate, measured=measured, threads=key.threads,
                    busy_share=share)


def record_rate(key: RateKey, tokens: int, seconds: float, path: Path | None = None) -> bool:
    """Record a finished prefill of `tokens` tokens in `seconds` for `key`. Returns whether it was
    stored: not when the read was shorter than `MIN_MEASURED_TOKENS`, the time is not positive, or
    the file cannot be written (a cache: never an error). A damaged file is replaced."""
    if tokens < MIN_MEASURED_TOKENS or not seconds > 0 or not math.isfinite(seconds):
        return False
    try:
        path = path or rates_path()
    except OSError:  # the cache dir cannot be created
        return False
    rates = _load(path)
    kept = [*rates.pop(key, []), tokens / seconds][-RATES_KEPT:]
    rates[key] = kept  # re-inserted last: the most recently measured
    while len(rates) > MAX_KEYS:
        del rates[next(iter(rates))]
    return _save(path, rates)


def _load(path: Path) -> dict[RateKey, list[float]]:
    """Key -> rates, oldest key first; {} for a missing, unreadable or damaged file, and entries
    that do not parse are skipped."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8, not JSON
        return {}
    if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("rates"), list):
        return {}
    rates: dict[RateKey, list[float]] = {}
    for entry in data["rates"]:
        try:
            key = RateKey(str(entry["model"]), str(entry["device"]), str(entry["weights"]), int(entry["threads"]))
            values = [float(v) for v in entry["tokens_per_s"]
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0]
        except (TypeError, KeyError, ValueError):
            continue
        if values:
            rates[key] = values[-RATES_KEPT:]
    return rates


def _save(path: Path, rates: dict[RateKey, list[float]]) -> bool:
    """Write atomically (`paths.write_text_atomic`); False when it cannot be written."""
    data = {"format": _FORMAT, "rates": [
        {"model": k.model, "device": k.device, "weights": k.weights, "threads": k.threads, "tokens_per_s": v}
        for k, v in rates.items()]}
    try:
        paths.write_text_atomic(path, json.dumps(data, indent=1))
    except OSError:
        return False
    return True
