"""Where one decode step's time goes, and what a one-row int4 projection could do instead.

    python bench/decode_profile.py --model shape --threads 2          # the 1.5B shape (bench/speed.py's)
    python bench/decode_profile.py --model default --threads 2        # the embedded SmolLM2-135M
    python bench/decode_profile.py --model shape --parts ab --rounds 7
    python bench/decode_profile.py --model default --parts head --rounds 9
    python bench/decode_profile.py --model default --threads 1 --context 1024 --parts sites
    python bench/decode_profile.py --model default --threads 1 --context 1024 --parts steps --rounds 9
    python bench/decode_profile.py --model default --threads 1 --context 1024 --parts sites steps --recall 1024

profile: the model loaded as the app loads it on this CPU (`load_model(weights="int4")`), `--context`
tokens of P05 read in 512-token chunks, then `--steps` decode steps under torch.profiler, each part
labelled with `record_function`: the int4 projections (`Int4Linear`, fused q|k|v and gate|up
included), the LM head (`Int8Linear`: its int8 step copy or its two 4-bit planes), attention over
the cache (`LayerKV.attend` with its workspace update, and `compress`), and the rest (norms,
RoPE's inputs, residual adds, the activation, the embedding lookup). Counts every operator torch
ran per step (`ops_per_step`) and the operators called from Python (`top_level_ops_per_step`).
The int4 projections' rate is the bytes they read (codes + scales and zeros, each layer once) per
second, against a 512 MiB copy measured in the same run (`common.copy_bandwidth_gb_s`, read + write counted).

ab: the same decode steps with the int4 layers on torch's int4 kernel (today) against their
bfloat16 copy at one row too (`Int4Linear.dense`, kept on a CPU with AVX-512 BF16), interleaved
round by round (ABAB), median of `--rounds`; the logits of both are compared. Both run the general
decode loop (`CompressedDecoder.fast_steps = False`), whose projections all call `forward`.

sites: operators per decode step by the engine function that called them (`sites`), and the
general loop's total (`general_ops_per_step`).

--recall N: each decode (a fork of the snapshot) starts with a question that recalls N tokens of
the document in three spans, in focus (span recall's default), as an app's answer does; the
question's own operators are not counted.

steps: decode steps through `engine.models.decode_step` (the default) against the general layer
loop it replaced (`CompressedDecoder.fast_steps = False`), interleaved the same way; logits compared.

head: the LM head on its two 4-bit planes (today where the CPU has AVX-512 BF16) against an int8
step copy run by `aten._weight_int8pack_mm` (today's path without it; the copy here is read back
through the kernel, good for timing only), interleaved the same way.

Writes docs/bench/decode_profile_<model>.{json,csv} with the machine and the load average at
start and end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

PARTS = ("int4 projections", "LM head", "attention + cache", "rest")


def load(model: str, threads: int):
    from engine.models.loader import load_model

    if model == "shape":
        import speed

        return load_model(str(speed.shape_folder()), device="cpu", weights="int4", threads=threads)
    return load_model("default", device="cpu", weights="int4", threads=threads)


def book_ids(lm, n: int) -> list[int]:
    from engine.documents import load_document

    doc = load_document(common.corpus_dir() / "pdf" / "P05_dmca.pdf")
    return lm.tokenizer("\n\n".join(s.text for s in doc.segments), add_special_tokens=False)["input_ids"][:n]


# `--recall N`: each decode starts with a question that recalls N document tokens in focus (span
# recall, the app's default), as an answer does: (span positions, layer -> keys and values, tokens).
RECALL: tuple | None = None
QUESTION = "\nQuestion: what does the law say about circumvention?\nAnswer:"


def snapshot(lm, ids: list[int], recall_tokens: int = 0):
    """The compact-position cache of `ids` read in 512-token chunks; with `recall_tokens`, also sets
    `RECALL` to that many tokens spread over the document (three spans), captured while reading."""
    import torch

    from engine.kvcache.span_recall import SpanCapture
    from engine.models.decoder import ChunkTaps
    from engine.settings import CachePolicy

    global RECALL
    cache = lm.decoder.new_cache(CachePolicy(), "compact")
    capture = SpanCapture() if recall_tokens else None
    for first in range(0, len(ids), 512):
        lm.decoder.forward(torch.tensor(ids[first : first + 512]), cache, taps=ChunkTaps(archive=capture))
    if recall_tokens:
        third = recall_tokens // 3
        starts = [0, len(ids) // 2 - third // 2, len(ids) - (recall_tokens - 2 * third)]
        spans = torch.cat([torch.arange(s, s + (third if i < 2 else recall_tokens - 2 * third))
                           for i, s in enumerate(starts)]).unique()
        RECALL = (spans, {layer: (k[:, spans], v[:, spans]) for layer, (k, v) in capture.keys_values().items()},
                  len(ids))
    return cache


def ask(lm, cache) -> None:
    """Feed `QUESTION` into `cache` recalling `RECALL`'s tokens in focus (`SpanRecaller`), if set."""
    import torch

    from engine.kvcache.span_recall import SpanRecaller
    from engine.models.decoder import ChunkTaps

    if RECALL is not None:
        spans, kv, n = RECALL
        recaller = SpanRecaller(None, spans, focus=True, n_tokens=n, reread=kv)
        question = torch.tensor(lm.tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
        with torch.profiler.record_function("question"):
            lm.decoder.forward(question, cache, taps=ChunkTaps(recaller=recaller))


def decode(lm, cache, steps: int) -> tuple[list[float], list]:
    """`steps` greedy decode steps on a fork of `cache`: seconds per step and the logits."""
    import torch

    twin, token, seconds, logits = cache.fork(), 42, [], []
    ask(lm, twin)
    for _ in range(steps):
        t0 = time.perf_counter()
        out = lm.decoder.forward(torch.tensor([token]), twin, slack_tokens=twin.decode_slack, reuse_workspace=True)
        seconds.append(time.perf_counter() - t0)
        logits.append(out)
        token = int(out[-1].argmax())
    return seconds, logits


@contextlib.contextmanager
def labelled(spent: dict | None = None):
    """Wrap the int4 layers, the LM head and the cache's attend/compress: in `record_function` labels,
    or, with `spent`, timed (seconds added to `spent[label]`; no profiler overhead)."""
    import torch

    from engine.kvcache.cache import LayerKV
    from engine.models import decode_step
    from engine.models.int4_cpu import Int4Linear, Int8Linear

    saved = {(cls, name): getattr(cls, name) for cls, name in
             ((Int4Linear, "forward"), (Int4Linear, "step_output"), (Int8Linear, "forward"), (LayerKV, "attend"),
              (LayerKV, "compress"), (decode_step, "attend_step"))}

    def wrap(cls, name, label):
        inner = saved[cls, name]

        def labelled_call(*a, **k):
            if spent is None:
                with torch.profiler.record_function(label):
                    return inner(*a, **k)
            t0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
        setattr(cls, name, labelled_call)

    wrap(Int4Linear, "forward", "int4 projections")
    wrap(Int4Linear, "step_output", "int4 projections")  # the fast decode step's (engine.models.decode_step)
    wrap(Int8Linear, "forward", "LM head")
    wrap(LayerKV, "attend", "attention + cache")
    wrap(LayerKV, "compress", "attention + cache")
    wrap(decode_step, "attend_step", "attention + cache")
    try:
        yield
    finally:
        for (cls, name), fn in saved.items():
            setattr(cls, name, fn)


def int4_bytes(model) -> int:
    """Bytes an int4 decode step reads from the `Int4Linear` layers (codes + scales and zeros), each
    storage once (fused layers share their parts' codes)."""
    from engine.models.int4_cpu import Int4Linear, Int8Linear

    seen, total = set(), 0
    for module in model.modules():
        if type(module) is Int4Linear and not isinstance(module, Int8Linear):
            for t in (module.packed, module.scales_and_zeros):
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += t.untyped_storage().nbytes()
    return total


def profile(lm, cache, steps: int) -> dict:
    """Per-step milliseconds by part (timed, no profiler) and operator counts (profiled), module docstring."""
    import torch

    decode(lm, cache, 2)  # warm: the workspace's first build, allocator
    spent: dict = {}
    with labelled(spent):
        seconds, _ = decode(lm, cache, steps)
    with labelled(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decode(lm, cache, steps)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    ops = {p: 0 for p in PARTS}
    for e in events:
        parent = e.cpu_parent
        while parent is not None and parent.name not in PARTS:
            parent = parent.cpu_parent
        ops["rest" if parent is None else parent.name] += 1
    top = {p: {} for p in PARTS}  # operators called from Python, by name, per part
    for e in events:
        if e.cpu_parent is None or e.cpu_parent.name in PARTS:
            part = top["rest" if e.cpu_parent is None else e.cpu_parent.name]
            part[e.name] = part.get(e.name, 0) + 1
    for p in PARTS:
        print(p, sorted(((n / steps, name) for name, n in top[p].items()), reverse=True)[:12], flush=True)
    step_ms = 1000 * sum(seconds) / steps
    out = {"step_ms": step_ms, "ops_per_step": len(events) / steps,
           "top_level_ops_per_step": sum(1 for e in events if e.cpu_parent is None or e.cpu_parent.name in PARTS) / steps}
    for p in PARTS[:-1]:
        out[f"{p} ms"] = 1000 * spent.get(p, 0.0) / steps
    out["rest ms"] = step_ms - sum(out[f"{p} ms"] for p in PARTS[:-1])
    for p in PARTS:
        out[f"{p} ops"] = ops[p] / steps
    return out


def sites(lm, cache, steps: int) -> dict:
    """aten operators per decode step by call site: every torch call from Python is wrapped (a
    `TorchFunctionMode`) in a `record_function` named after the innermost function under engine/
    on the stack, and each operator torch.profiler records counts for the label it ran under (an
    operator another one called counts for its caller's site); `ops_per_step` is their total."""
    import torch
    from torch.overrides import TorchFunctionMode

    engine_dir = str(common.REPO / "engine") + os.sep

    class Sites(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            frame = sys._getframe(1)
            while frame is not None and not frame.f_code.co_filename.startswith(engine_dir):
                frame = frame.f_back
            label = "outside engine/" if frame is None else \
                f"site {frame.f_code.co_filename[len(engine_dir):]}: {frame.f_code.co_name}"
            with torch.profiler.record_function(label):
                return func(*args, **(kwargs or {}))

    decode(lm, cache, 2)
    totals = {}
    for fast in (False, True):  # the general loop's count first, then today's (by site)
        lm.decoder.fast_steps = fast
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, Sites():
                decode(lm, cache, steps)
        finally:
            lm.decoder.fast_steps = True
        counts: dict = {}
        for e in prof.events():
            if not e.name.startswith("aten::") or _under(e, "question"):  # `--recall`'s question: not a step
                continue
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("site ") and parent.name != "outside engine/":
                parent = parent.cpu_parent
            name = "outside engine/" if parent is None else parent.name.removeprefix("site ")
            counts[name] = counts.get(name, 0) + 1
        totals[fast] = sum(counts.values()) / steps
    by_site = {name: round(n / steps, 1) for name, n in sorted(counts.items(), key=lambda kv: -kv[1])}
    for name, n in by_site.items():
        print(f"{n:8.1f}  {name}", flush=True)
    return {"ops_per_step": totals[True], "general_ops_per_step": totals[False], "ops_by_site": by_site}


def _under(event, label: str) -> bool:
    """Whether a profiler event ran inside a `record_function(label)`."""
    parent = event.cpu_parent
    while parent is not None and parent.name != label:
        parent = parent.cpu_parent
    return parent is not None


def steps_ab(lm, cache, steps: int, rounds: int) -> dict:
    """Decode steps through `engine.models.decode_step` (today) against the general layer loop
    (`decoder.fast_steps = False`, the path before it), interleaved round by round (ABAB), median of
    `rounds` medians; their logits must be equal."""
    decoder = lm.decoder
    if not decoder.fast_steps:
        return {"steps_ab": "no fast decode steps for this model"}
    times, logits = {"fast": [], "general": []}, {}
    decode(lm, cache, 2)
    for r in range(rounds):
        for variant in ("fast", "general") if r % 2 == 0 else ("general", "fast"):
            decoder.fast_steps = variant == "fast"
            try:
                seconds, logits[variant] = decode(lm, cache, steps)
            finally:
                decoder.fast_steps = True
            times[variant].append(1000 * common.median(seconds))
        print(f"round {r}: fast {times['fast'][-1]:.1f} ms, general {times['general'][-1]:.1f} ms, "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    import torch

    return {"fast_step_ms": common.median(times["fast"]), "general_step_ms": common.median(times["general"]),
            "fast_step_speedup": common.median(times["general"]) / common.median(times["fast"]),
            "fast_equal_logits": all(torch.equal(a, b) for a, b in zip(logits["fast"], logits["general"], strict=True))}


def dense_forward(self, x):
    """`Int4Linear.forward` with the bfloat16 copy at every row count (the ab part's variant B)."""
    import torch

    y = torch.nn.functional.linear(self._kernel_input(x), self.dense).to(x.dtype)
    if x.dim() != 2:
        y = y.view(*x.shape[:-1], self.out_features)
    return y if self.bias is None else y + self.bias


def ab(lm, cache, steps: int, rounds: int) -> dict:

    from engine.models.int4_cpu import Int4Linear

    if not any(type(m) is Int4Linear and m.dense is not None for m in lm.decoder.model.modules()):
        return {"ab": "no bfloat16 copy on this CPU"}
    kernel = Int4Linear.forward
    times, logits = {"kernel": [], "dense": []}, {}
    decode(lm, cache, 2)
    for r in range(rounds):
        for variant in ("kernel", "dense") if r % 2 == 0 else ("dense", "kernel"):
            Int4Linear.forward = kernel if variant == "kernel" else dense_forward
            lm.decoder.fast_steps = False  # the general loop, whose projections all go through `forward`
            try:
                seconds, logits[variant] = decode(lm, cache, steps)
            finally:
                Int4Linear.forward = kernel
                lm.decoder.fast_steps = True
            times[variant].append(1000 * common.median(seconds))
        print(f"round {r}: kernel {times['kernel'][-1]:.1f} ms, dense {times['dense'][-1]:.1f} ms, load {os.getloadavg()[0]:.2f}", flush=True)
    diff = max(float((a - b).abs().max()) for a, b in zip(logits["kernel"], logits["dense"], strict=True))
    return {"kernel_ms": common.median(times["kernel"]), "dense_ms": common.median(times["dense"]),
            "dense_speedup": common.median(times["kernel"]) / common.median(times["dense"]), "max_logit_diff": diff,
            "rounds": rounds}


def head_step_copy(head) -> tuple:
    """An int8 step copy (as `Int8Linear(step_copy=True)` holds it) of an `Int8Linear` that has none, from the weights its
    two 4-bit planes apply, read back through the kernel on identity rows (rounded to bfloat16 on
    the way: good for timing, not bit for bit the loader's copy)."""
    import torch

    from engine.models.int4_cpu import GROUP_SIZE

    rows = []
    for first in range(0, head.in_features, 256):
        eye = torch.eye(head.in_features)[first : first + 256]
        rows.append(torch.ops.aten._weight_int4pack_mm_for_cpu(head._kernel_input(eye), head.packed, GROUP_SIZE,
                                                               head.scales_and_zeros).float())
    applied = torch.cat(rows).T.contiguous()  # [out, in]; then int4_cpu's step copy: int8 per output feature
    scales = (applied.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
    return torch.round(applied / scales.float()[:, None]).clamp(-127, 127).to(torch.int8), scales


def head_ab(lm, cache, steps: int, rounds: int) -> dict:
    """Decode steps with the LM head on its two 4-bit planes (today on AVX-512 BF16) against an int8
    step copy (`_weight_int8pack_mm`, today without AVX-512 BF16), interleaved (module docstring)."""
    head = lm.decoder.model.lm_head
    if head.step_codes is not None:
        return {"head_ab": "the LM head already decodes on its step copy here"}
    codes, scales = head_step_copy(head)
    times = {"planes": [], "int8": []}
    decode(lm, cache, 2)
    for r in range(rounds):
        for variant in ("planes", "int8") if r % 2 == 0 else ("int8", "planes"):
            head.step_codes, head.step_scales = (codes, scales) if variant == "int8" else (None, None)
            try:
                seconds, _ = decode(lm, cache, steps)
            finally:
                head.step_codes = head.step_scales = None
            times[variant].append(1000 * common.median(seconds))
        print(f"round {r}: head planes {times['planes'][-1]:.1f} ms, int8 {times['int8'][-1]:.1f} ms, "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    return {"head_planes_ms": common.median(times["planes"]), "head_int8_ms": common.median(times["int8"]),
            "head_int8_speedup": common.median(times["planes"]) / common.median(times["int8"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="shape", choices=["shape", "default"])
    parser.add_argument("--context", type=int, default=512, help="tokens read before decoding (a multiple of 512)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--recall", type=int, default=0,
                        help="tokens a question recalls in focus before each decode (span recall), 0: none")
    parser.add_argument("--out", help="results' name under docs/bench (default: decode_profile_<model>)")
    parser.add_argument("--parts", nargs="+", default=["profile", "ab"], choices=["profile", "ab", "head", "sites", "steps"])
    args = parser.parse_args()
    common.setup(args.threads)
    meta = common.machine_info()
    t0 = time.perf_counter()
    lm = load(args.model, args.threads)
    print(f"loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    cache = snapshot(lm, book_ids(lm, args.context), args.recall)
    row = {"model": args.model, "threads": args.threads, "context": args.context, "steps": args.steps,
           "recall": args.recall,
           "int4_mb": int4_bytes(lm.decoder.model) / 1e6, "copy_gb_s": common.copy_bandwidth_gb_s()}
    if "profile" in args.parts:
        row.update(profile(lm, cache, args.steps))
        row["int4_gb_s"] = row["int4_mb"] / row["int4 projections ms"]
        print(row, flush=True)
    if "sites" in args.parts:
        row.update(sites(lm, cache, args.steps))
        print(f"ops per step: {row['ops_per_step']:.0f}", flush=True)
    if "steps" in args.parts:
        row.update(steps_ab(lm, cache, args.steps, args.rounds))
        print(row, flush=True)
    if "ab" in args.parts:
        row.update(ab(lm, cache, args.steps, args.rounds))
        print(row, flush=True)
    if "head" in args.parts:
        row.update(head_ab(lm, cache, args.steps, args.rounds))
        print(row, flush=True)
    meta.update(weights=lm.weights_label, load_avg_at_end=[round(x, 2) for x in os.getloadavg()])
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
    common.write_results(args.out or f"decode_profile_{args.model}", [rounded], list(rounded), meta)


if __name__ == "__main__":
    main()
