"""Typed settings: the KV cache policy and the engine options, saved as TOML in the config dir.

`CachePolicy` is everything that changes what the compressed cache holds; every field of it is part
of the prefix-cache key, so changing one invalidates exactly the prefix caches it affects.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from engine import paths
from engine.disk_budget import sized_for_this_disk
from engine.errors import SettingsError

POSITION_MODES = ("auto", "original", "compact")
DEVICES = ("auto", "cpu", "cuda")
WEIGHTS = ("auto", "4bit", "int4", "full")


@dataclass(frozen=True)
class CachePolicy:
    """What the compressed KV cache keeps and how it stores it.

    budget_tokens: tokens kept per layer and KV head (sinks + window + heavy hitters), default 4096.
    sink_tokens: first tokens always kept (attention sinks, StreamingLLM), default 4.
    window_tokens: newest tokens always kept (recent window), default 1024.
    kv_bits: storage of the quantized part, 4 (INT4), 8 (INT8) or 16 (float16), default 4.
    group_size: channels per scale / zero point in group quantization, default 32.
    residual_tokens: newest tokens held in 16-bit before they are quantized, default 128.
    position_mode: RoPE positions: "original" (true positions; the document must fit the model's
        max_position_embeddings), "compact" (slot order, StreamingLLM) or "auto" (original when it
        fits, else compact), default "auto".
    chunk_tokens: prefill chunk; memory peaks at budget + one chunk, default 512.
    block_tokens: tokens per block in the pool (PagedAttention), default 64.
    heavy_hitter_score: how heavy hitters are ranked: "mean" attention per query that could see
        the token (kvpress ObservedAttention, default), the plain "sum" (H2O), or "window": as
        "mean", but a prefill chunk is scored by its last 32 queries only (SnapKV's observation
        window): half a chunk's attention time, 1.35-2.2x further from the full cache than "mean"
        (docs/BENCHMARKS.md, section 2f). On the embedded model "mean" was 1.3-1.8x closer to the
        full cache than "sum" (KL, 6 contexts at 50/75/90 % dropped; section 2d).

    With the defaults on SmolLM2-135M (30 layers, 3 KV heads, head dim 64) an 8192-token document
    is held in 33 MiB (scores and positions included) against 180 MiB for a full 16-bit cache; on
    Llama-3.2-3B a 131,072-token document takes 0.15 GiB against 14.0 GiB (`halaman estimate`).
    """

    budget_tokens: int = 4096
    sink_tokens: int = 4
    window_tokens: int = 1024
    kv_bits: int = 4
    group_size: int = 32
    residual_tokens: int = 128
    position_mode: str = "auto"
    chunk_tokens: int = 512
    block_tokens: int = 64
    heavy_hitter_score: str = "mean"

    def validate(self) -> None:
        """Raise SettingsError naming the first invalid field and a valid value."""
        ints = ("budget_tokens", "sink_tokens", "window_tokens", "group_size", "residual_tokens", "chunk_tokens", "block_tokens")
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SettingsError(f"{name} must be a whole number ≥ 0, got {value!r}")
        for name in ("budget_tokens", "group_size", "chunk_tokens", "block_tokens", "window_tokens"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be at least 1")
        if self.sink_tokens + self.window_tokens > self.budget_tokens:
            raise SettingsError(
                f"budget ({self.budget_tokens} tokens) is smaller than sink + window "
                f"({self.sink_tokens} + {self.window_tokens}): raise the budget or shrink the window"
            )
        if self.residual_tokens > self.window_tokens:
            raise SettingsError(
                f"residual ({self.residual_tokens} tokens) must not exceed the window ({self.window_tokens}): "
                "the 16-bit residual is part of the recent window"
            )
        if self.kv_bits not in (4, 8, 16):
            raise SettingsError(f"kv_bits must be 4, 8 or 16, got {self.kv_bits!r}")
        if self.heavy_hitter_score not in ("sum", "mean", "window"):
            raise SettingsError(f"heavy_hitter_score must be 'sum', 'mean' or 'window', got {self.heavy_hitter_score!r}")
        if self.position_mode not in POSITION_MODES:
            raise SettingsError(f"position_mode must be one of {', '.join(POSITION_MODES)}, got {self.position_mode!r}")

    def replace(self, **changes: Any) -> CachePolicy:
        """A copy with `changes` applied and validated."""
        policy = dataclasses.replace(self, **changes)
        policy.validate()
        return policy


SELECTIONS = ("spans", "blocks")


@dataclass(frozen=True)
class RecallSettings:
    """The archive of every token on disk, and recall from it at question time (engine.kvcache.recall).

    archive: while a document is read, also write every token's K/V (group-quantized) with per-block
        key bounds to disk beside its prefix cache; off = answers use the snapshot only, default on.
    archive_bits: bits per archived value, 4 (default) or 2 (smaller, less exact).
    block_tokens: tokens per archive block, the unit that is scored and recalled, default 32; must
        divide the prefill chunk.
    recall_tokens: tokens per layer and KV head that a question may bring back, default 6144 (and
        never more than the model's positions leave beside the question and the answer); 0 = no
        recall. They are held beside the snapshot while the question is answered, so the KV memory
        mark grows by them (`halaman estimate`).
    selection: "spans" (default): the spans (pages, parts of files) `engine.evidence.select`
        chooses with the document's structure, the conversation and the question's words are
        recalled whole (`engine.kvcache.span_recall`); "blocks": each layer's attention picks
        archive blocks (`engine.kvcache.recall`).
    max_spans: at most this many spans per question (default 12; within recall_tokens).
    focus: with span recall, answer from the recalled spans only: the snapshot's other document
        tokens are hidden while the question is answered (default on).
    """

    archive: bool = True
    archive_bits: int = 4
    block_tokens: int = 32
    recall_tokens: int = 6144
    selection: str = "spans"
    max_spans: int = 12
    focus: bool = True

    def validate(self, chunk_tokens: int | None = None) -> None:
        """Raise SettingsError for the first invalid value."""
        if self.archive_bits not in (2, 4):
            raise SettingsError(f"archive_bits must be 2 or 4, got {self.archive_bits!r}")
        for name in ("block_tokens", "recall_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SettingsError(f"recall {name} must be a whole number ≥ 0, got {value!r}")
        if self.block_tokens < 1:
            raise SettingsError("recall block_tokens must be at least 1")
        if self.selection not in SELECTIONS:
            raise SettingsError(f"recall selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if not isinstance(self.max_spans, int) or isinstance(self.max_spans, bool) or self.max_spans < 1:
            raise SettingsError(f"recall max_spans must be a whole number ≥ 1, got {self.max_spans!r}")
        if not isinstance(self.focus, bool):
            raise SettingsError(f"recall focus must be true or false, got {self.focus!r}")
        if chunk_tokens is not None and chunk_tokens % self.block_tokens:
            raise SettingsError(
                f"recall block_tokens ({self.block_tokens}) must divide the prefill chunk ({chunk_tokens} tokens)")

    def replace(self, **changes: Any) -> RecallSettings:
        settings = dataclasses.replace(self, **changes)
        settings.validate()
        return settings


@dataclass(frozen=True)
class CloudSettings:
    """Optional cloud fallback to an OpenAI-compatible Chat Completions endpoint. Off by default.

    enabled: nothing leaves the machine unless this is on.
    base_url: e.g. "https://api.example.com/v1" or "http://127.0.0.1:8000/v1" (vLLM, llama.cpp server).
    model: model name sent to the endpoint.
    temperature, max_tokens: decoding options sent with each request.
    context_tokens: how many tokens the endpoint accepts (document text is cut to fit).
    auto_escalate: escalate by itself when the local answer's confidence is below the threshold.
    escalation_threshold: mean log-probability per token of the local answer below which it escalates.
    ask_before_sending: show what would be sent and let the user cancel.
    connect_timeout_s, read_timeout_s: network timeouts in seconds.
    The API key is never here: it lives in the OS keyring.
    """

    enabled: bool = False
    base_url: str = ""
    model: str = ""
    temperature: float = 0.2
    max_tokens: int = 512
    context_tokens: int = 16000
    auto_escalate: bool = False
    escalation_threshold: float = -1.0
    ask_before_sending: bool = True
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def validate(self) -> None:
        """Raise SettingsError for the first invalid value (a URL is required only when enabled)."""
        if self.enabled and not self.base_url.startswith(("http://", "https://")):
            raise SettingsError("cloud endpoint URL must start with https:// (or http:// for a local server)")
        if self.enabled and not self.model.strip():
            raise SettingsError("cloud model name is empty: enter the model the endpoint serves")
        if self.max_tokens < 1 or self.context_tokens < 256:
            raise SettingsError("cloud max_tokens must be ≥ 1 and context_tokens ≥ 256")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise SettingsError("cloud timeouts must be positive numbers of seconds")

    def replace(self, **changes: Any) -> CloudSettings:
        settings = dataclasses.replace(self, **changes)
        settings.validate()
        return settings


@dataclass(frozen=True)
class EngineSettings:
    """Engine options, saved in `settings.toml` under the platform config dir.

    model: "default" (the embedded SmolLM2-135M-Instruct), a .gguf file, a Hugging Face model
        folder, or a hub id.
    device: "auto" (CUDA when available), "cpu" or "cuda".
    weights: "auto", "4bit" (bitsandbytes NF4), "int4" (torch's int4 CPU kernel with an 8-bit LM
        head; CPU only) or "full" (the compute dtype: float32 on a CPU). "auto" is NF4 on a GPU,
        where VRAM is the limit, and int4 on a CPU (faster than float32 there; NF4 only for a model
        whose files cannot be streamed into int4 and whose float32 weights take over a quarter of
        RAM); NF4 on a CPU dequantizes every weight matrix on every call
        (decode 1.5x slower than float32; see `engine.models.weight_format.choose_weights`).
    threads: CPU threads for torch; 0 = the idle physical cores, measured when the model loads and
        before each document is read (`engine.threads`).
    max_new_tokens: longest answer, in tokens.
    draft_tokens: prompt-lookup speculative decoding: at most this many tokens drafted from the
        document per step and checked in one pass (greedy decoding only; the answer is the same
        token for token); 0 = off, the default: with the embedded 135M model, which paraphrases
        more than it quotes, 11-20 % of drafts were accepted and answers were not faster
        (docs/BENCHMARKS.md, section 5). Worth turning on for a model that quotes its source.
    temperature: 0 = greedy decoding.
    repetition_penalty: CTRL-style penalty on tokens already in the answer (1 = off).
    prefix_cache: reuse persisted document caches.
    prefix_cache_disk_bytes: disk budget of the prefix-cache store, in bytes (LRU beyond it); a
        new installation's is a quarter of the free disk, 2-32 GiB (`engine.disk_budget`).
    cache: the KV cache policy; recall: the on-disk archive and recall at question time;
    cloud: the optional cloud fallback.
    include_generated_files: also read a repository's lock files and the files .gitattributes marks
        linguist-generated or linguist-vendored (left out by default, with a warning naming them).
    """

    model: str = "default"
    device: str = "auto"
    weights: str = "auto"
    threads: int = 0
    max_new_tokens: int = 256
    draft_tokens: int = 0
    temperature: float = 0.0
    repetition_penalty: float = 1.1
    prefix_cache: bool = True
    prefix_cache_disk_bytes: int = field(default_factory=sized_for_this_disk)
    cache: CachePolicy = field(default_factory=CachePolicy)
    cloud: CloudSettings = field(default_factory=CloudSettings)
    recall: RecallSettings = field(default_factory=RecallSettings)
    include_generated_files: bool = False

    def validate(self) -> None:
        """Raise SettingsError for the first invalid value."""
        self.cache.validate()
        self.cloud.validate()
        self.recall.validate(self.cache.chunk_tokens)
        if self.device not in DEVICES:
            raise SettingsError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.weights not in WEIGHTS:
            raise SettingsError(f"weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise SettingsError(f"threads must be 0 (measure idle cores) or a count ≥ 1, got {self.threads!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SettingsError(f"max_new_tokens must be at least 1, got {self.max_new_tokens!r}")
        if not isinstance(self.draft_tokens, int) or not 0 <= self.draft_tokens <= 64:
            raise SettingsError(f"draft_tokens must be between 0 (off) and 64, got {self.draft_tokens!r}")
        if not 0 <= float(self.temperature) <= 5:
            raise SettingsError(f"temperature must be between 0 and 5, got {self.temperature!r}")
        if not 1 <= float(self.repetition_penalty) <= 3:
            raise SettingsError(f"repetition_penalty must be between 1 and 3, got {self.repetition_penalty!r}")
        if not isinstance(self.prefix_cache_disk_bytes, int) or self.prefix_cache_disk_bytes < 0:
            raise SettingsError("prefix_cache_disk_bytes must be a number of bytes ≥ 0")
        if not isinstance(self.model, str) or not self.model.strip():
            raise SettingsError("model must name the default, a .gguf file, a model folder or a hub id")

    def replace(self, **changes: Any) -> EngineSettings:
        """A copy with `changes` applied and validated (`cache=` takes a CachePolicy, `recall=` a
        RecallSettings)."""
        settings = dataclasses.replace(self, **changes)
        settings.validate()
        return settings

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, unknown: list[str] | None = None) -> EngineSettings:
        """Build and validate from a dict (as read from TOML). Raises SettingsError for a value of
        the wrong type or out of range, and for an unknown key unless `unknown` is given: then
        each unknown key's dotted name ("theme", "cache.budget") is appended to it instead."""
        found: list[str] = []
        values = _typed(cls, data, "", found)
        tables = {name: _typed(kind, _table(data, name), f"{name}.", found)
                  for name, kind in (("cache", CachePolicy), ("cloud", CloudSettings), ("recall", RecallSettings))}
        if found and unknown is None:
            raise SettingsError(f"unknown setting {found[0]}{_did_you_mean(found[0])}")
        if unknown is not None:
            unknown += found
        settings = cls(**values, cache=CachePolicy(**tables["cache"]), cloud=CloudSettings(**tables["cloud"]),
                       recall=RecallSettings(**tables["recall"]))
        settings.validate()
        return settings


def settings_path() -> Path:
    """Where the settings file lives."""
    return paths.config_dir() / "settings.toml"


def load_settings(path: Path | None = None, *, warn: Callable[[str], None] | None = None) -> EngineSettings:
    """Read settings; a missing file gives the defaults.

    A byte-order mark (Notepad, PowerShell's `Out-File`: UTF-8, UTF-16 or UTF-32) is read like the
    same file without one (B29). An unknown key is ignored and `warn` gets one line naming the file
    and the key ("settings file …/settings.toml: unknown setting theme ignored"); without `warn`
    it is ignored silently. Raises SettingsError, whose one line starts with "settings file
    <path>: ", for a file that cannot be read or decoded, is not TOML, or holds a value of the
    wrong type or out of range.
    """
    path = path or settings_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return EngineSettings()
    except OSError as exc:
        raise SettingsError(f"settings file {path}: cannot be read ({exc.strerror or exc}); fix or delete it") from None
    try:
        data = tomllib.loads(_decoded(raw))
    except UnicodeDecodeError as exc:
        raise SettingsError(f"settings file {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); "
                            "save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"settings file {path}: not valid TOML ({exc}); fix or delete it") from None
    unknown: list[str] = []
    try:
        settings = EngineSettings.from_dict(data, unknown=unknown)
    except SettingsError as exc:
        raise SettingsError(f"settings file {path}: {exc}; fix or delete it") from None
    for key in unknown if warn is not None else ():
        warn(f"settings file {path}: unknown setting {key} ignored{_did_you_mean(key)}")
    return settings


def save_settings(settings: EngineSettings, path: Path | None = None) -> Path:
    """Validate and write settings atomically (temp file + rename). Returns the path."""
    settings.validate()
    path = path or settings_path()
    paths.write_text_atomic(path, tomli_w.dumps(settings.to_dict()))
    return path


# Longest first: the UTF-32 LE mark starts with the UTF-16 LE one.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _decoded(raw: bytes) -> str:
    """A settings file's text: UTF-8 (TOML's encoding), or what its byte-order mark names.
    Raises UnicodeDecodeError."""
    codec = next((codec for bom, codec in _BOMS if raw.startswith(bom)), "utf-8")
    return raw.decode(codec)


_NESTED = ("cache", "cloud", "recall")
_KINDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text in quotes"}


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise SettingsError(f"{name} must be a table ([{name}]), got {value!r}")
    return value


def _typed(cls: type, data: dict[str, Any], prefix: str, unknown: list[str]) -> dict[str, Any]:
    """The fields of `cls` found in `data`, each checked against its default's type; the dotted
    names of keys `cls` does not have are appended to `unknown`. Raises SettingsError."""
    fields = {f.name: f for f in dataclasses.fields(cls) if not (cls is EngineSettings and f.name in _NESTED)}
    values = {}
    for key, value in data.items():
        if cls is EngineSettings and key in _NESTED:
            continue
        if key not in fields:
            unknown.append(prefix + key)
            continue
        default = fields[key].default
        kind = type(fields[key].default_factory() if default is dataclasses.MISSING else default)
        fits = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
                else isinstance(value, kind) and (kind is bool or not isinstance(value, bool)))
        if not fits:
            raise SettingsError(f"{prefix}{key} must be {_KINDS[kind]}, got {value!r}")
        if kind is float and not math.isfinite(value):  # TOML reads nan and inf as floats
            raise SettingsError(f"{prefix}{key} must be a finite number, got {value!r}")
        values[key] = float(value) if kind is float else value
    return values


def _did_you_mean(key: str) -> str:
    """" (did you mean cache.budget_tokens?)" for a misspelt key, else ""."""
    prefix, _, name = key.rpartition(".")
    tables = {"": EngineSettings, "cache": CachePolicy, "cloud": CloudSettings, "recall": RecallSettings}
    if prefix not in tables:
        return ""
    known = [f.name for f in dataclasses.fields(tables[prefix])]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {prefix + '.' if prefix else ''}{close[0]}?)" if close else ""
