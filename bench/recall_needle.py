"""Needle retrieval through the app's own path (DocumentSession, chat framing): full cache, the
snapshot alone (no recall), and recall from the archive.

    python bench/recall_needle.py --parts needle long multi bits latency   # resumable (bench/.work)

A haystack is ordinary prose (varied sentences, seeded) with one stated fact, "Note: the access
code for the archive room is 58213." The question is "What is the access code for the archive
room?"; a hit is the code appearing in the greedy answer (24 new tokens). The embedded model answers
this framing with a full cache; "What is the pass key?" it does not (docs/BENCHMARKS.md).

parts:
  needle   4k and 8k tokens, 10 prompts each (depths 5-95 %), at 90 % and 97 % dropped (budget =
           10 % / 3 % of the document): full cache (16-bit, nothing evicted), snapshot only, recall
           with the default 1,024 recall tokens, and recall limited to the budget itself (so held +
           recalled memory is at most twice the snapshot's).
  long     32k tokens (compact positions, 4x the model's 8,192), default policy, snapshot vs recall.
  multi    16k tokens with 5 different facts, one question each, default policy.
  bits     archive INT4 vs INT2 at 8k / 97 % dropped: hits and archive bytes per token.
  latency  added time to first token on a 131,635-token archive (P16's length, Think Python in docs/CORPUS.md): scoring and reading
           split; the archive is written from random K/V by the real writer, because recall's cost
           depends on the archive's size, not its contents; the question's queries are the model's.
Results: docs/bench/recall_*.json|csv, tables printed; rows logged to bench/.work/recall_log.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import common

FACTS = [
    ("the access code for the archive room is {v}", "What is the access code for the archive room?", "code"),
    ("the name of the night gardener is {v}", "What is the name of the night gardener?", "name"),
    ("the ferry to the island leaves from pier {v}", "From which pier does the ferry to the island leave?", "code"),
    ("the secret ingredient of the soup is {v}", "What is the secret ingredient of the soup?", "word"),
    ("the museum guard's locker number is {v}", "What is the museum guard's locker number?", "code"),
]
NAMES = ["Oswin", "Marisol", "Tobiah", "Ilsabet", "Corwin", "Annika", "Ferdinand", "Perpetua"]
WORDS = ["saffron", "tamarind", "cardamom", "sumac", "fenugreek", "juniper", "lovage", "galangal"]
SENTENCES = [
    "The committee met on Tuesday to review the quarterly budget and discussed several minor items.",
    "Rain fell steadily over the valley while the farmers repaired fences along the northern fields.",
    "The library extended its opening hours during the examination period for the students.",
    "A new bus route connects the harbour with the railway station every twenty minutes.",
    "The bakery on the corner sells fresh bread each morning before seven o'clock.",
    "Engineers inspected the old bridge and recommended painting the railings next spring.",
    "The museum added a small exhibition about local pottery from the last century.",
    "Volunteers planted trees along the river bank to prevent erosion after the floods.",
    "The choir rehearsed twice a week in the hall behind the town church.",
    "Several shops on the main street closed early because of the festival parade.",
    "The school garden produced more tomatoes this year than ever before.",
    "Fishermen returned to the harbour at dusk with a modest catch of mackerel.",
]


def value_for(kind: str, rng: random.Random) -> str:
    if kind == "code":
        return str(rng.randint(10000, 99999))
    return rng.choice(NAMES if kind == "name" else WORDS)


def haystack(tokenizer, n_tokens: int, facts: list[tuple[float, str]], seed: int) -> str:
    """Prose of about `n_tokens` tokens with each (depth, sentence) fact inserted at its depth."""
    rng = random.Random(seed)
    per_sentence = len(tokenizer(" ".join(SENTENCES), add_special_tokens=False)["input_ids"]) / len(SENTENCES)
    count = int(n_tokens / per_sentence)
    body = [rng.choice(SENTENCES) for _ in range(count)]
    for depth, sentence in sorted(facts, reverse=True):
        body.insert(int(depth * count), f"Note: {sentence}.")
    return " ".join(body)


def document(text: str):
    from engine.documents import Document, Segment

    return Document(title="haystack", source="", kind="text",
                    segments=[Segment(text=text, label="haystack.txt", page=None, path="haystack.txt")])


class Runner:
    def __init__(self, args) -> None:
        from engine.models.loader import load_model

        self.model = load_model("default", device="cpu")  # the app's weights, the app's path
        self.score = args.score
        self.log_path = common.WORK / f"recall_log{args.tag}.jsonl"
        self.done = {}
        if self.log_path.is_file():
            for line in self.log_path.read_text().splitlines():
                row = json.loads(line)
                self.done[row["id"]] = row

    def session(self, n_tokens: int, *, budget: int | None, recall_tokens: int, bits: int = 4, position_mode="auto"):
        from engine.session import DocumentSession
        from engine.settings import CachePolicy, EngineSettings, RecallSettings

        if budget is None:  # full cache: nothing evicted, 16-bit
            policy = CachePolicy(budget_tokens=n_tokens + 1024, window_tokens=1024, kv_bits=16, position_mode=position_mode)
        else:
            window = min(1024, budget // 4)
            policy = CachePolicy(budget_tokens=budget, window_tokens=window, residual_tokens=min(128, window),
                                 position_mode=position_mode, heavy_hitter_score=self.score)
        settings = EngineSettings(max_new_tokens=24, prefix_cache=False, cache=policy,
                                  recall=RecallSettings(archive=recall_tokens > 0 or budget is not None,
                                                        archive_bits=bits, recall_tokens=recall_tokens))
        return DocumentSession(self.model, settings)

    def log(self, row: dict) -> dict:
        self.done[row["id"]] = row
        with self.log_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return row

    def ask_all(self, case: str, text: str, questions: list[tuple[str, str]], configs: dict) -> list[dict]:
        """One prefill per config (budget, bits, position mode); every recall variant of it is an ask."""
        rows = []
        for name, (budget, bits, mode, recalls) in configs.items():
            todo = [(r_name, r) for r_name, r in recalls.items()
                    if any(f"{case}|{name}|{r_name}|{q}" not in self.done for q, _ in questions)]
            if not todo:
                rows += [self.done[f"{case}|{name}|{r_name}|{q}"] for r_name in recalls for q, _ in questions]
                continue
            n_tokens = len(self.model.tokenizer(text)["input_ids"]) + 256  # + instructions and template
            session = self.session(n_tokens, budget=budget, recall_tokens=max(recalls.values()), bits=bits,
                                   position_mode=mode)
            report = session.open(document(text))
            for r_name, recall_tokens in recalls.items():
                session.settings = session.settings.replace(recall=session.settings.recall.replace(recall_tokens=recall_tokens))
                for question, expected in questions:
                    row_id = f"{case}|{name}|{r_name}|{question}"
                    if row_id in self.done:
                        rows.append(self.done[row_id])
                        continue
                    began = time.perf_counter()
                    answer = session.ask(question)
                    stats = answer.recall
                    rows.append(self.log({
                        "id": row_id, "case": case, "config": name, "recall": r_name, "question": question,
                        "expected": expected, "answer": answer.text, "hit": expected.lower() in answer.text.lower(),
                        "doc_tokens": report.document_tokens, "budget": budget, "recall_tokens": recall_tokens,
                        "ttft_s": answer.time_to_first_token_s, "ask_s": time.perf_counter() - began,
                        "recall_s": stats.question_s if stats else 0.0, "recalled": stats.tokens_recalled if stats else 0,
                        "recall_total_s": stats.seconds if stats else 0.0, "refreshes": stats.refreshes if stats else 0,
                        "tokens": len(answer.token_ids), "decode_tok_s": answer.decode_tokens_per_s,
                        "prefill_s": report.prefill_seconds, "position_mode": report.position_mode,
                    }))
            session.close()
        return rows


LENGTHS = (4096, 8192)
DROPPED = (0.90, 0.97)
FULL_CACHE = True
RECALLS: tuple[int, ...] | None = None  # --recall: the recall budgets a needle run asks with


def ratio_configs(n: int, recall_default: int = 1024) -> dict:
    configs = {"full cache": (None, 4, "auto", {"-": 0})} if FULL_CACHE else {}
    for dropped in DROPPED:
        budget = int(n * (1 - dropped))
        budget -= budget % 32
        recalls = {"snapshot only": 0, f"recall {recall_default}": recall_default, "recall = budget": budget}
        if RECALLS is not None:
            recalls = {name: r for name, r in recalls.items() if (r if name != "recall = budget" else -1) in RECALLS}
        configs[f"{dropped:.0%} dropped"] = (budget, 4, "auto", recalls)
    return configs


def part_needle(run: Runner, prompts: int) -> list[dict]:
    rows = []
    for n in LENGTHS:
        target = n - 400  # room for the question and the answer inside the model's 8,192 positions
        for p in range(prompts):
            rng = random.Random(1000 * n + p)
            code = value_for("code", rng)
            depth = 0.05 + 0.9 * p / max(1, prompts - 1)
            text = haystack(run.model.tokenizer, target, [(depth, FACTS[0][0].format(v=code))], seed=p)
            rows += run.ask_all(f"needle{n}-{p}", text, [(FACTS[0][1], code)], ratio_configs(target))
    return rows


def part_long(run: Runner, prompts: int) -> list[dict]:
    rows = []
    for p in range(prompts):
        rng = random.Random(32000 + p)
        code = value_for("code", rng)
        depth = 0.05 + 0.9 * p / max(1, prompts - 1)
        text = haystack(run.model.tokenizer, 32768, [(depth, FACTS[0][0].format(v=code))], seed=100 + p)
        configs = {"default policy": (4096, 4, "auto", {"snapshot only": 0, "recall 1024": 1024})}
        rows += run.ask_all(f"long32k-{p}", text, [(FACTS[0][1], code)], configs)
    return rows


def part_multi(run: Runner, prompts: int) -> list[dict]:
    rows = []
    for p in range(prompts):
        rng = random.Random(16000 + p)
        values = [value_for(kind, rng) for _, _, kind in FACTS]
        depths = [0.1 + 0.8 * i / (len(FACTS) - 1) for i in range(len(FACTS))]
        rng.shuffle(depths)
        facts = [(d, f.format(v=v)) for d, (f, _, _), v in zip(depths, FACTS, values, strict=True)]
        text = haystack(run.model.tokenizer, 16384, facts, seed=200 + p)
        questions = [(q, v) for (_, q, _), v in zip(FACTS, values, strict=True)]
        configs = {"default policy": (4096, 4, "auto", {"snapshot only": 0, "recall 1024": 1024})}
        rows += run.ask_all(f"multi16k-{p}", text, questions, configs)
    return rows


def part_bits(run: Runner, prompts: int) -> list[dict]:
    rows = []
    n = 8192 - 400
    budget = int(n * 0.03) - int(n * 0.03) % 32
    for p in range(prompts):
        rng = random.Random(1000 * 8192 + p)
        code = value_for("code", rng)
        depth = 0.05 + 0.9 * p / max(1, prompts - 1)
        text = haystack(run.model.tokenizer, n, [(depth, FACTS[0][0].format(v=code))], seed=p)
        configs = {f"INT{bits} archive": (budget, bits, "auto", {"recall 1024": 1024}) for bits in (4, 2)}
        rows += run.ask_all(f"needle8192-{p}", text, [(FACTS[0][1], code)], configs)
    return rows


def part_latency(run: Runner, trials: int) -> list[dict]:
    """Recall cost on an archive of P16's length (random contents, real writer, real queries)."""
    import torch

    from engine.kvcache.archive import Archive, ArchiveLayout, ArchiveWriter
    from engine.kvcache.recall import Recaller
    from engine.settings import CachePolicy

    n = 131_635
    decoder = run.model.decoder
    shape = decoder.shape
    rows = []
    for bits in (4, 2):
        layout = ArchiveLayout(shape.num_layers, shape.kv_heads, shape.head_dim, n, 32, bits, 32)
        path = common.WORK / f"latency-int{bits}.archive.safetensors"
        if not path.with_suffix(".digest").is_file():  # none yet, or one from before the digests
            writer = ArchiveWriter(path.with_suffix(".tmp"), layout, decoder.rope)
            gen = torch.Generator().manual_seed(0)
            for start in range(0, n, 512):
                m = min(512, n - start)
                for layer in range(shape.num_layers):
                    k = torch.randn((shape.kv_heads, m, shape.head_dim), generator=gen)
                    writer.append(layer, start, k, torch.randn_like(k))
            digest, _ = writer.finish()
            writer.path.rename(path)
            path.with_suffix(".digest").write_text(digest)
        verify_began = time.perf_counter()  # opening checks the header and the digest tables, not every block
        archive = Archive.open(path, sha256=path.with_suffix(".digest").read_text(), expect=layout)
        verify_s = time.perf_counter() - verify_began
        question = run.model.tokenizer("What is the access code for the archive room?<|im_end|>\n<|im_start|>assistant\n",
                                       add_special_tokens=False)["input_ids"]
        for t in range(trials):
            # The question after the whole document (compact positions); the held part does not
            # change what recall costs, so both runs start from an empty cache.
            cache = decoder.new_cache(CachePolicy(position_mode="compact"), "compact")
            cache.seen_tokens = n
            baseline = time.perf_counter()
            decoder.prefill(torch.tensor(question), cache)
            plain_s = time.perf_counter() - baseline
            cache = decoder.new_cache(CachePolicy(position_mode="compact"), "compact")
            cache.seen_tokens = n
            recaller = Recaller(archive, 1024, decoder.rope, decoder.scaling)
            began = time.perf_counter()
            decoder.prefill(torch.tensor(question), cache, recaller=recaller)
            with_s = time.perf_counter() - began
            s = recaller.stats
            rows.append(run.log({
                "id": f"latency|int{bits}|{t}", "bits": bits, "trial": t, "doc_tokens": n,
                "archive_bytes": path.stat().st_size, "bytes_per_token": round(path.stat().st_size / n),
                "verify_s": verify_s, "question_prefill_s": plain_s, "with_recall_s": with_s,
                "added_s": with_s - plain_s, "score_s": s.score_s, "read_s": s.read_s, "bytes_read": s.bytes_read,
                "blocks_scored": s.blocks_scored,
            }))
        archive.close()
    return rows


def summarise(rows: list[dict], keys: list[str]) -> list[dict]:
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault(tuple(row[k] for k in keys), []).append(row)
    out = []
    for key, members in cells.items():
        hits = sum(r["hit"] for r in members)
        out.append({**dict(zip(keys, key, strict=True)), "hits": f"{hits}/{len(members)}",
                    "median recall ms at question": 1000 * common.median([r["recall_s"] for r in members]),
                    "median recall ms per answer": 1000 * common.median([r.get("recall_total_s", 0.0) for r in members]),
                    "median recalled tokens": common.median([r["recalled"] for r in members])})
    return out


def main() -> None:
    global LENGTHS, DROPPED, FULL_CACHE, RECALLS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["needle", "long", "multi", "bits", "latency"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--long-prompts", type=int, default=10)
    parser.add_argument("--multi-prompts", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="needle: document lengths")
    parser.add_argument("--dropped", type=float, nargs="+", default=list(DROPPED), help="needle: shares dropped")
    parser.add_argument("--no-full-cache", action="store_true", help="needle: skip the full-cache reference")
    parser.add_argument("--tag", default="", help="appended to the result files' and the row log's names (recall_needle_TAG.csv)")
    parser.add_argument("--score", default="mean", choices=["sum", "mean", "window"],
                        help="heavy-hitter score of the compressed rows (CachePolicy.heavy_hitter_score; section 2f)")
    parser.add_argument("--columns", default="auto", choices=["auto", "flash", "blocked"],
                        help="how a prefill chunk's H2O column sums are computed (column_sums.METHOD; section 5n)")
    parser.add_argument("--recall", type=int, nargs="+", default=None,
                        help="needle: only these recall budgets (0 = snapshot only, -1 = the budget; default: 0, 1024 and -1)")
    args = parser.parse_args()
    LENGTHS, DROPPED, FULL_CACHE = tuple(args.lengths), tuple(args.dropped), not args.no_full_cache
    RECALLS = tuple(args.recall) if args.recall is not None else None
    common.setup(args.threads)
    import engine.kvcache.column_sums as column_sums

    column_sums.METHOD = args.columns
    meta = {**common.machine_info(), "column_sums": args.columns}
    run = Runner(args)
    for part in args.parts:
        if part == "needle":
            rows = part_needle(run, args.prompts)
            for row in rows:
                row["length"] = "4k" if row["doc_tokens"] < 6000 else "8k"
            common.write_results(f"recall_needle{args.tag}", summarise(rows, ["length", "config", "recall"]),
                                 ["length", "config", "recall", "hits", "median recalled tokens", "median recall ms at question", "median recall ms per answer"], meta)
        elif part == "long":
            rows = part_long(run, args.long_prompts)
            common.write_results(f"recall_long{args.tag}", summarise(rows, ["config", "recall", "position_mode"]),
                                 ["config", "position_mode", "recall", "hits", "median recalled tokens", "median recall ms at question", "median recall ms per answer"], meta)
        elif part == "multi":
            rows = part_multi(run, args.multi_prompts)
            for row in rows:
                row["prompt"] = row["case"]
            common.write_results(f"recall_multi{args.tag}", summarise(rows, ["prompt", "recall"]),
                                 ["prompt", "recall", "hits", "median recalled tokens", "median recall ms at question", "median recall ms per answer"], meta)
        elif part == "bits":
            rows = part_bits(run, args.prompts)
            common.write_results("recall_bits", summarise(rows, ["config"]),
                                 ["config", "hits", "median recalled tokens", "median recall ms at question", "median recall ms per answer"], meta)
        elif part == "latency":
            rows = part_latency(run, 5)
            cells = {}
            for row in rows:
                cells.setdefault(row["bits"], []).append(row)
            table = [{"archive": f"INT{b}", "doc tokens": rs[0]["doc_tokens"], "bytes/token": rs[0]["bytes_per_token"],
                      "archive MiB": rs[0]["archive_bytes"] / 2**20, "checksum at open s": rs[0]["verify_s"],
                      "median added TTFT s": common.median([r["added_s"] for r in rs]),
                      "median score s": common.median([r["score_s"] for r in rs]),
                      "median read s": common.median([r["read_s"] for r in rs]),
                      "MiB read": rs[0]["bytes_read"] / 2**20, "trials": len(rs)} for b, rs in cells.items()]
            common.write_results("recall_latency", table, list(table[0]), meta)


if __name__ == "__main__":
    main()
