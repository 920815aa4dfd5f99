"""`halaman models`: the curated model list with what fits this machine, downloads, and choosing one.

    halaman models                     the table: size, weights as loaded here, KV bytes per token, fits here?
    halaman models pull qwen2.5-1.5b   download (progress, speed, time left); Ctrl-C keeps the partial
    halaman models use qwen2.5-1.5b    make it the model in settings.toml

`pull` and `use` take a list id or any hub repository ("org/name").
"""

from __future__ import annotations

import argparse
import sys
import threading

from engine.errors import HalamanError
from engine.settings import load_settings, save_settings
from engine.units import format_bytes


def print_warning(line: str) -> None:
    """One warning line on stderr, as the CLI prints them ("warning: settings file …: unknown setting theme ignored")."""
    print(f"warning: {line}", file=sys.stderr)


def add_models_command(sub) -> None:
    """Register `models` on the `halaman` sub-command parser `sub`."""
    models = sub.add_parser("models", help="list models with what fits this machine; download or choose one")
    models.set_defaults(handler=_cmd_list)
    actions = models.add_subparsers(dest="models_action")
    pull = actions.add_parser("pull", help="download a model (resumes an interrupted download)")
    pull.add_argument("model", help="an id from `halaman models` or a hub repository org/name")
    pull.add_argument("--revision", default="main", help="branch, tag or commit on the hub")
    pull.add_argument("--use", action="store_true", help="make it the model in settings.toml once downloaded")
    pull.set_defaults(handler=_cmd_pull)
    use = actions.add_parser("use", help="make a model the one in settings.toml")
    use.add_argument("model", help="an id from `halaman models`, a hub repository, 'default', a folder or a .gguf file")
    use.set_defaults(handler=_cmd_use)


def repo_for(key: str) -> str:
    """The hub repository of a list id; `key` itself when it is already "org/name".
    Raises ModelError (listing the ids) for anything else."""
    from engine.models.catalog import find, load_catalog

    return key if key.count("/") == 1 and all(key.split("/")) else find(load_catalog(), key).repo


def _cmd_list(args: argparse.Namespace) -> int:
    from engine.models.catalog import READING_COPY_PART, detect_memory, fit, load_catalog
    from engine.models.download import downloaded_folder, partial_bytes

    settings = load_settings(warn=print_warning)
    memory = detect_memory(settings.device)
    policy = settings.cache
    print(f"this machine  {memory.name}: {format_bytes(memory.total_bytes)} "
          f"({'GPU, 16-bit' if memory.device == 'cuda' else 'CPU, float32'} compute; weights {settings.weights}: "
          f"{'4-bit NF4 on a GPU, 4-bit int4 on a CPU' if settings.weights == 'auto' else settings.weights})\n"
          f"fits         weights + KV cache at its peak (budget {policy.budget_tokens:,} tokens, INT{policy.kv_bits}, "
          f"recall {settings.recall.recall_tokens:,}) + workspace, against the whole {memory.name}"
          + (f"\nweights      as loaded here, not the download; {memory.int4_note()}" if memory.device == "cpu" else "")
          + "\n")
    rows = [("id", "parameters", "download", "weights", "KV/token (FP16)", "fits", "why", "on disk")]
    for model in load_catalog():
        verdict = fit(model, settings, memory)
        partial = partial_bytes(model.repo)
        state = ("downloaded" if downloaded_folder(model.repo) else
                 f"partial {format_bytes(partial)}" if partial else "gated: log in" if model.gated else
                 "embedded (default)" if model.embedded else "")
        copy = " + reading copy" if READING_COPY_PART in dict(verdict.weights_parts) else ""
        rows.append((model.id, f"{model.parameters / 1e9:.2f} B", f"≈ {format_bytes(model.download_bytes)}",
                     f"{format_bytes(verdict.weights_bytes)} {verdict.weights_label}{copy}", f"{model.kv_bytes_per_token:,} B",
                     "yes" if verdict.fits else "no", verdict.reason, state))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(f"\nmodel now    {settings.model}\n"
          "download     halaman models pull ID   (then: halaman models use ID)")
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from engine.models.download import pull

    repo = repo_for(args.model)
    line = _ProgressLine()
    print(f"Downloading {repo} ...", file=sys.stderr, flush=True)
    try:
        folder = pull(repo, revision=args.revision, progress=line.update, cancel=threading.Event())
    except KeyboardInterrupt:
        line.close()
        print(f"halaman: download cancelled; what arrived is kept: run halaman models pull {args.model} to resume",
              file=sys.stderr)
        raise
    finally:
        line.close()
    print(f"{repo} is in {folder}")
    if args.use:
        return _use(repo)
    print(f"use it       halaman models use {args.model}   (or: halaman ask --model {repo} FILE QUESTION)")
    return 0


def _cmd_use(args: argparse.Namespace) -> int:
    from engine.models.source import resolve

    from engine.models.catalog import load_catalog

    spec = {m.id.lower(): m.repo for m in load_catalog()}.get(args.model.lower(), args.model)
    source = resolve(spec)  # fails now, with what to do, rather than at the next question
    if source.kind == "hub":
        raise HalamanError(f"{spec} is not downloaded yet: run halaman models pull {args.model}")
    return _use(spec)


def _use(spec: str) -> int:
    settings = load_settings(warn=print_warning)
    path = save_settings(settings.replace(model=spec))
    print(f"model        {spec} (saved in {path})")
    return 0


class _ProgressLine:
    """One line on stderr, rewritten in place: file, bytes of total, percent, speed, time left."""

    def __init__(self) -> None:
        self.width = 0

    def update(self, progress) -> None:
        text = f"{progress.file}  {progress.summary()}"
        print("\r" + text.ljust(self.width), end="", file=sys.stderr, flush=True)
        self.width = len(text)

    def close(self) -> None:
        if self.width:
            print(file=sys.stderr)
            self.width = 0
