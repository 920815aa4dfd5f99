"""Tables and plots for bench/kv_quality.py from its finished rows (bench/.work/*.jsonl, kvpress JSON).

    python bench/kv_quality.py --report
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

import common

KVPRESS_NAMES = {"none": "kvpress: none (full DynamicCache)", "streaming_llm": "kvpress StreamingLLM",
                 "snapkv": "kvpress SnapKV", "observed_attention": "kvpress ObservedAttention (H2O-like)",
                 "expected_attention": "kvpress ExpectedAttention"}


def _jsonl(part: str) -> list[dict]:
    path = common.WORK / f"quality-{part}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _kvpress() -> dict:
    path = common.WORK / "kvpress-results.json"
    return json.loads(path.read_text()) if path.exists() else {"passkey": [], "continuation": [], "errors": []}


def passkey_table(tokenizer) -> tuple[list[dict], list[str]]:
    cells: dict[tuple[str, float], dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for row in _jsonl("passkey") + _jsonl("long"):
        cells[("ours " + row["method"], row["ratio"])][row["length"]].append(row["hit"])
    for row in _kvpress()["passkey"]:
        length, _depth, key = row["id"].split("|")  # ids are "length|depth|key"
        length = int(length)
        hit = key in tokenizer.decode(row["generated"])
        cells[(KVPRESS_NAMES[row["press"]], row["ratio"])][length].append(hit)
    lengths = sorted({n for per in cells.values() for n in per})
    rows = []
    for (method, ratio), per in sorted(cells.items(), key=lambda kv_: (kv_[0][1], kv_[0][0])):
        row = {"method": method, "dropped": f"{ratio:.0%}" if ratio else "0 %"}
        for n in lengths:
            hits = per.get(n, [])
            row[f"{n // 1024}k"] = f"{sum(hits)}/{len(hits)}" if hits else ""
        rows.append(row)
    return rows, [f"{n // 1024}k" for n in lengths]


def continuation_table() -> list[dict]:
    """Means over the samples that every method finished (the same text for every row)."""
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    ours, theirs = _jsonl("continuation"), _kvpress()["continuation"]
    common_ids = {r["sample"] for r in ours if r["method"] == "full-fp16"} & {r["id"] for r in theirs if r["press"] == "none"}
    for row in ours:
        if row["sample"] in common_ids:
            groups[("ours " + row["method"], row["ratio"])].append(row)
    for row in theirs:
        if row["id"] in common_ids:
            groups[(KVPRESS_NAMES[row["press"]], row["ratio"])].append(row)
    rows = []
    for (method, ratio), got in sorted(groups.items(), key=lambda kv_: (kv_[0][1], kv_[0][0])):
        mean = lambda key: sum(g[key] for g in got) / len(got)  # noqa: E731
        rows.append({"method": method, "dropped": f"{ratio:.0%}" if ratio else "0 %", "ratio": ratio, "samples": len(got),
                     "kept_tokens": round(mean("kept_tokens")), "ppl": math.exp(mean("nll")), "ref_ppl": math.exp(mean("ref_nll")),
                     "delta_nll": mean("nll") - mean("ref_nll"), "kl": mean("kl"), "top1_agree": mean("agree")})
    return rows


def stream_rows(bucket: int = 1024) -> list[dict]:
    rows = []
    for row in _jsonl("stream"):
        nll = row["nll"]
        for start in range(0, len(nll), bucket):
            part = nll[start : start + bucket]
            rows.append({"method": row["method"], "tokens_from": start, "tokens_to": start + len(part), "ppl": math.exp(sum(part) / len(part))})
    return rows


def report() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(common.hf_folder())
    meta = common.machine_info()
    kv = _kvpress()
    meta["kvpress"] = kv.get("versions")
    meta["kvpress_errors"] = kv.get("errors")
    pk, cols = passkey_table(tokenizer)
    common.write_results("quality_passkey", pk, ["method", "dropped", *cols], meta)
    cont = continuation_table()
    common.write_results("quality_continuation", cont, ["method", "dropped", "samples", "kept_tokens", "ppl", "delta_nll", "kl", "top1_agree"], meta)
    stream = stream_rows()
    summary = defaultdict(dict)
    for r in stream:
        summary[r["method"]][r["tokens_from"]] = r["ppl"]
    starts = sorted({r["tokens_from"] for r in stream})
    marks = [t for t in starts if t % 2048 == 0 or t in (7168, starts[-1])]
    cols = [f"{t}-{t + 1024}" for t in marks]
    table = [{"method": m, **{c: per.get(t, float("nan")) for c, t in zip(cols, marks)}} for m, per in summary.items()]
    common.write_results("quality_stream", table, ["method", *cols], meta)
    _plot(cont, stream)


def _plot(cont: list[dict], stream: list[dict]) -> None:
    plt = common.pyplot()
    fig, (a, c, b) = plt.subplots(1, 3, figsize=(15, 4))
    methods = sorted({r["method"] for r in cont if r["ratio"] > 0})
    for i, m in enumerate(methods):
        sub = sorted((r for r in cont if r["method"] == m and r["ratio"] > 0), key=lambda r: r["ratio"])
        style = "-" if m.startswith("ours") else "--"
        marker = "osD^vx<>p"[i % 9]
        a.plot([r["ratio"] for r in sub], [r["kl"] for r in sub], style, marker=marker, label=m, ms=4)
        b.plot([r["ratio"] for r in sub], [r["top1_agree"] for r in sub], style, marker=marker, label=m, ms=4)
        c.plot([r["ratio"] for r in sub], [r["delta_nll"] for r in sub], style, marker=marker, label=m, ms=4)
    int4 = next((r for r in cont if r["method"] == "ours int4-only"), None)
    if int4:
        a.axhline(int4["kl"], color="grey", ls=":", lw=1, label="ours INT4 only (0 % dropped)")
        b.axhline(int4["top1_agree"], color="grey", ls=":", lw=1)
        c.axhline(int4["delta_nll"], color="grey", ls=":", lw=1)
    c.axhline(0, color="black", lw=0.6)
    c.set(xlabel="fraction of context tokens dropped", ylabel="NLL − full-cache NLL, nats/token",
          title="continuation: NLL increase (lower is better)")
    a.set(yscale="log", xlabel="fraction of context tokens dropped", ylabel="KL(full ‖ method), nats/token",
          title="continuation: KL vs. full cache (lower is better)")
    b.set(xlabel="fraction of context tokens dropped", ylabel="top-1 agreement with full cache",
          title="continuation: greedy agreement (higher is better)")
    a.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(common.OUT / "quality_continuation.png")

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for m in sorted({r["method"] for r in stream}):
        sub = [r for r in stream if r["method"] == m]
        ax.plot([(r["tokens_from"] + r["tokens_to"]) / 2 for r in sub], [r["ppl"] for r in sub], "o-", ms=3, label=m)
    ax.axvline(8192, color="grey", ls=":", lw=1)
    ax.text(8300, 20, "model's 8,192 positions", fontsize=7, va="top")
    ax.set(xlabel="token position in Think Python (the first ~4k tokens are front matter and contents)",
           ylabel="perplexity per 1,024 tokens (log)", yscale="log",
           title="streaming perplexity (chunks of 512; lower is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(common.OUT / "quality_stream.png")
