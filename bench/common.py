"""Shared helpers of the KV-cache benchmarks: environment, model, prompts, metrics, tables, plots.

Every script calls `setup()` first: it pins torch to `--threads` (default 1; on a shared 2-core
machine two OpenMP threads fighting other processes made our chunked prefill several times
slower), points HALAMAN_HOME at a reusable scratch folder (bench/.home unless set) so the
one-off GGUF conversion is cached, and keeps transformers offline and quiet.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
DOCS = REPO / "docs"
OUT = DOCS / "bench"
WORK = Path(os.environ.get("HALAMAN_BENCH_WORK", BENCH / ".work"))
THINK_PYTHON = "P16_thinkpython2.pdf"
KVPRESS_PYTHON = BENCH / ".venv-kvpress" / "bin" / "python"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


_STARTED: dict = {}


def setup(threads: int = 1) -> None:
    """Environment for a benchmark run (call before importing torch-heavy engine modules)."""
    os.environ.setdefault("HALAMAN_HOME", str(BENCH / ".home"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    # What the run starts with: the code it imports now and the load it starts under (machine_info
    # runs when results are written, after a checkout or a load change may have happened).
    _STARTED.update(_run_start())
    import logging
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)


def selection_flags(parser) -> None:
    """How much a question reads (engine.evidence.reading_budget), to measure other limits: --reading
    picks the budget the embedded model gets (small: its own; large: a >= 1B model's), the other
    flags change single fields of it."""
    parser.add_argument("--reading", choices=("small", "large"), default="small",
                        help="the reading budget the embedded model is given (default: its own, small)")
    budget_field_flags(parser)


def budget_field_flags(parser) -> None:
    """The flags that change single fields of a reading budget (`engine.evidence.reading_budget`)."""
    parser.add_argument("--words-relative", type=float, help="a further words span is read above this share of the best")
    parser.add_argument("--words-at-most", type=int, help="words spans read when nothing else chose any")
    parser.add_argument("--several-at-least", type=int, help="words spans a question asking for several things reads")
    parser.add_argument("--neighbours", type=int, choices=(0, 1), help="1: read the next page when the text runs on")
    parser.add_argument("--pages-at-least", type=int,
                        help="fewer pages (files) read: read the next ranked pages until this many are (0: none)")
    parser.add_argument("--best-last", type=int, choices=(0, 1), help="1: recall the spans best last, nearest the question")


def apply_selection_flags(args) -> dict:
    """Install the budget `selection_flags` parsed as the embedded model's (reading_budget.SMALL,
    which the session and the benches ask for); returns its fields, for the results' meta."""
    import dataclasses

    import engine.evidence.reading_budget as budgets

    budget = budgets.LARGE if args.reading == "large" else budgets.SMALL
    fields = {"words_relative": args.words_relative, "words_at_most": args.words_at_most,
              "several_at_least": args.several_at_least,
              "neighbours": None if args.neighbours is None else bool(args.neighbours),
              "pages_at_least": args.pages_at_least,
              "best_last": None if args.best_last is None else bool(args.best_last)}
    budget = dataclasses.replace(budget, **{k: v for k, v in fields.items() if v is not None})
    budgets.SMALL = budget
    return {"reading": args.reading, **{k: v for k, v in dataclasses.asdict(budget).items() if k != "label"}}


def corpus_dir() -> Path:
    """The test corpus (docs/CORPUS.md): $HALAMAN_CORPUS, else ../shared/corpus next to the repository."""
    env = os.environ.get("HALAMAN_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


def machine_info() -> dict:
    """Machine and versions, written at the top of every result file."""
    import psutil
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "os": platform.platform(),
        **(_STARTED or _run_start()),
    }


def _run_start() -> dict:
    """Load average, date and commit now: what `setup` records when a run starts."""
    return {"load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "date": time.strftime("%Y-%m-%d %H:%M"),
            "engine_commit": _engine_commit()}


def _engine_commit() -> str:
    """HEAD of the repository, with "+dirty" when engine/ has uncommitted changes (read-only git)."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "engine"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def load_lm(weights: str = "full"):
    """The embedded SmolLM2-135M-Instruct on the CPU.

    Quality and speed comparisons use float32 weights ("full"), the same weights kvpress and
    transformers get, so rows differ only in the cache. On a CPU the app also loads float32 weights
    for this model ("auto"); "4bit" loads the NF4 weights a GPU gets.
    """
    from engine.models.loader import load_model

    return load_model("default", device="cpu", weights=weights)


def llama_cpp(ids: list[int], lengths: list[int], decode_steps: int, threads: int) -> dict:
    """llama.cpp on the embedded GGUF and the same token ids, through `llamacpp_runner.py` inside
    bench/.venv-llamacpp: {"version", "rows": [{"tokens", "runs", "prefill_tok_s", "decode_ms"}]},
    or {"error": "..."} when that venv is missing or the runner fails. `ids` must reach
    max(lengths) + decode_steps tokens: the decode steps feed the tokens after each length."""
    import subprocess

    python = BENCH / ".venv-llamacpp" / "bin" / "python"
    if not python.exists():
        return {"error": "bench/.venv-llamacpp missing"}
    from engine.models.source import default_gguf_path

    task = WORK / "llamacpp-task.json"
    task.write_text(json.dumps({"gguf": str(default_gguf_path()), "ids": ids[: max(lengths) + decode_steps], "lengths": lengths,
                                "decode_steps": decode_steps, "threads": threads}))
    done = subprocess.run([str(python), str(BENCH / "llamacpp_runner.py"), str(task)], capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def hf_folder() -> Path:
    """The converted HF folder of the default model (config.json, model.safetensors, tokenizer)."""
    from engine.models.gguf_convert import converted_folder
    from engine.models.source import default_gguf_path

    return converted_folder(default_gguf_path())


def book_token_ids(tokenizer, pages: int | None = None) -> list[int]:
    """Token ids of Think Python's text (first `pages` pages, or all), cached under bench/.work."""
    tag = "all" if pages is None else f"p{pages}"
    cached = WORK / f"thinkpython-{tag}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    from engine.documents import load_document

    doc = load_document(corpus_dir() / "pdf" / THINK_PYTHON)
    segments = doc.segments[:pages] if pages else doc.segments
    text = "\n\n".join(s.text for s in segments)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    cached.write_text(json.dumps(ids))
    return ids


# ------------------------------------------------------------------------------------ passkey
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INTRO = "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n\n"
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\n\nWhat is the pass key? The pass key is"


def passkey_prompt(tokenizer, n_tokens: int, depth: float, key: int) -> tuple[list[int], list[int]]:
    """(context ids, question ids): context + question + 8 answer tokens fit in `n_tokens` positions,
    with the needle at `depth` of the filler."""
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    intro, needle, question, filler = enc(INTRO), enc(NEEDLE.format(key=key)), enc(QUESTION), enc(FILLER)
    room = n_tokens - len(intro) - len(needle) - len(question) - 8
    reps = filler * (room // len(filler) + 1)
    hay = reps[:room]
    cut = int(len(hay) * depth)
    cut -= cut % len(filler)  # insert between filler sentences
    return intro + hay[:cut] + needle + hay[cut:], question


def passkey_trials(lengths: list[int], depths: list[float], keys_per_cell: int, seed: int = 0) -> list[dict]:
    """The (length, depth, key) grid; keys are 5-digit numbers drawn from `seed`."""
    rng = random.Random(seed)
    return [
        {"length": n, "depth": d, "key": rng.randint(10000, 99999)}
        for n in lengths for d in depths for _ in range(keys_per_cell)
    ]


# ------------------------------------------------------------------------------------ metrics
def logit_metrics(ref_logits, logits, targets) -> dict:
    """Against a reference: mean KL(ref || ours) in nats, top-1 agreement, and both NLLs (nats/token).

    ref_logits, logits: `[T, vocab]`; targets: `[T]` (the actual next tokens).
    """
    import torch

    p = torch.log_softmax(ref_logits.float(), -1)
    q = torch.log_softmax(logits.float(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    nll = -q.gather(1, targets[:, None])[:, 0]
    ref_nll = -p.gather(1, targets[:, None])[:, 0]
    return {
        "kl": float(kl.mean()),
        "agree": float((p.argmax(-1) == q.argmax(-1)).float().mean()),
        "nll": float(nll.mean()),
        "ref_nll": float(ref_nll.mean()),
    }


def hf_trace(lm, ids, marks: list[int], decode_steps: int, chunk: int = 512):
    """The transformers reference: prefill `ids` (a 1-D LongTensor) into a DynamicCache `chunk` tokens at a time (the
    model of `lm`, Halaman's decoder bypassed), and at each length in `marks` (multiples of `chunk`)
    time `decode_steps` greedy decode steps, then crop them off again (transformers 5: a negative
    crop removes). Yields (n, prefill seconds so far, seconds of the last chunk, decode step seconds,
    cache) at each mark."""
    import torch
    from transformers import DynamicCache

    model, cache, elapsed = lm.decoder.model, DynamicCache(), 0.0
    with torch.inference_mode():
        for first in range(0, max(marks), chunk):
            t0 = time.perf_counter()
            model(ids[None, first : first + chunk], past_key_values=cache, logits_to_keep=1)
            last = time.perf_counter() - t0
            elapsed += last
            n = first + chunk
            if n in marks:
                times, token = [], 42
                for _ in range(decode_steps):
                    t0 = time.perf_counter()
                    logits = model(torch.tensor([[token]]), past_key_values=cache).logits
                    times.append(time.perf_counter() - t0)
                    token = int(logits[0, -1].argmax())
                cache.crop(-decode_steps)
                yield n, elapsed, last, times, cache


def median(values: list[float]) -> float:
    s = sorted(values)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


# ------------------------------------------------------------------------------------ output
def fmt(value, digits: int = 3) -> str:
    if isinstance(value, float):
        if value != value:
            return "—"
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def module_at(rev: str, path: str):
    """The Python file `path` of this repository as of commit `rev`, imported as its own module
    (the rest of `engine` stays current): old code run side by side with the current one."""
    import importlib.util
    import subprocess
    import tempfile

    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    name = f"{Path(path).stem}_{rev}"
    file = Path(tempfile.mkdtemp(dir=WORK)) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_results(name: str, rows: list[dict], columns: list[str], meta: dict) -> None:
    """Print the table, write docs/bench/<name>.{json,csv} and the markdown table to bench/.work/<name>.md."""
    table = markdown_table(rows, columns)
    print(f"\n## {name}\n\n{table}\n", flush=True)
    (OUT / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    with (OUT / f"{name}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    WORK.mkdir(parents=True, exist_ok=True)  # ignored by git: absent in a fresh clone
    (WORK / f"{name}.md").write_text(table + "\n")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def copy_bandwidth_gb_s() -> float:
    """This CPU's memory bandwidth: GB/s of a 512 MiB float32 copy, read + write counted, median of 5."""
    import torch

    src = torch.empty(128 * 1024 * 1024, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    return 2 * src.nbytes / median(copies) / 1e9
