"""Attention as the judge among candidates: does the question's own attention over the archived keys
of its candidate spans put the evidence first, more often than the words do?

    python bench/attention_rank.py [--set P16-dev --set requests-dev ...] [--candidates 30]

Per question (follow-ups left out): the app's ranked candidates (`engine.evidence.select`, the
first `--candidates`); the question is prefilled after the document's instructions alone (a cheap
probe, no document tokens), and every layer's queries score the candidates' archived keys, each key
rotated at its offset within its span and the queries after the longest span, as a focused answer
places them. One softmax per query over all candidate tokens (QRHead's query-focused score, Wu et
al. 2025, arXiv 2506.09944; InfiniRetri, arXiv 2502.12962, scores chunks the same way); a
candidate's score is the mass its tokens receive per token (longer spans are not favoured), averaged
over the question's tokens. Compared, on the same candidates:
  words       the app's order (structure, sections, conversation, then BM25)
  all heads   the mass summed over every layer and head
  best head   one query head chosen on the other sets (QRHead calibrates its heads the same way),
              and the head that is best on the set itself (in-sample, an upper bound)
  fused       reciprocal-rank fusion of the words' rank and the cross-chosen head's (k = 5)
Documents are read once into the prefix store of $HALAMAN_HOME (the archive is what is scored).
Results: docs/bench/attention_rank.{json,csv}, docs/bench/attention_rank_summary.{json,csv}.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import common

SETS = ("P16-dev", "P16-dev-hard", "requests-dev", "requests-dev-hard")
FUSION_K = 5


def candidate_attention(query, keys, owner, n_candidates: int, scaling: float):
    """Attention each candidate receives per token: `[kv_heads, group, n_candidates]`.

    query `[kv_heads, group, m, head_dim]` and keys `[kv_heads, R, head_dim]`, both after RoPE;
    `owner` `[R]` the candidate of each key (every candidate owns at least one). Each query's
    softmax runs over all R keys; a candidate's mass is summed over its keys, divided by their
    number, and averaged over the m queries."""
    import torch

    logits = torch.einsum("hgmd,hrd->hgmr", query.float(), keys.float()) * scaling
    probs = logits.softmax(dim=-1).mean(dim=2)  # [H, G, R]
    mass = torch.zeros((*probs.shape[:2], n_candidates), dtype=probs.dtype).index_add_(2, owner, probs)
    return mass / torch.bincount(owner, minlength=n_candidates).to(mass.dtype)


def probe_queries(session, question: str) -> dict:
    """layer -> the question's queries `[query_heads, m, head_dim]` (before RoPE), prefilled after
    the document prefix's template and instructions only."""
    import torch

    from engine.kvcache.recall import RecallHook
    from engine.prompt import question_suffix

    class Probe(RecallHook):
        reselects = False

        def __init__(self) -> None:
            super().__init__(1)
            self.queries = {}

        def recall(self, layer, held_index, query, start, dtype, compact=False):
            self.queries[layer] = query.float().clone()
            return None

    decoder = session.model.decoder
    ids = session.opened.ids
    first, end = session.opened.text_range
    cache = decoder.new_cache(session.opened.snapshot.policy, "original")
    decoder.prefill(torch.tensor(ids[:first] + ids[end:]), cache)
    probe = Probe()
    decoder.prefill(torch.tensor(session.reader.encode(question_suffix(session.layout, question))), cache, recaller=probe)
    return probe.queries


def score_candidates(session, queries: dict, spans, candidates: list[int]):
    """layer -> `candidate_attention` of the candidates' archived keys."""
    import torch

    from engine.kvcache.attention import apply_rope

    archive, decoder = session.opened.archive, session.model.decoder
    positions, owner, offsets = [], [], []
    for c, i in enumerate(candidates):
        span = spans.spans[i]
        positions += range(span.token_start, span.token_end)
        owner += [c] * span.tokens
        offsets += range(span.tokens)
    order = sorted(range(len(positions)), key=positions.__getitem__)
    positions = torch.tensor([positions[k] for k in order])
    owner = torch.tensor([owner[k] for k in order])
    offsets = torch.tensor([offsets[k] for k in order])
    heads = archive.layout.kv_heads
    kcos, ksin = decoder.rope.lookup(offsets)
    out = {}
    for layer, query in queries.items():
        keys = archive.decode_one(archive.read(layer, positions.expand(heads, -1).contiguous(), kinds="k"), "k", torch.float32)
        q_heads, m, dim = query.shape
        qcos, qsin = decoder.rope.lookup(int(offsets.max()) + 1 + torch.arange(m))
        rotated = apply_rope(query, qcos, qsin).view(heads, q_heads // heads, m, dim)
        out[layer] = candidate_attention(rotated, apply_rope(keys, kcos, ksin), owner, len(candidates), decoder.scaling)
    return out


def rank_of_evidence(scores: list[float], is_evidence: list[bool]) -> int:
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return next(k for k, i in enumerate(order, 1) if is_evidence[i])


def fused_scores(attention: list[float]) -> list[float]:
    """Reciprocal-rank fusion of the candidates' given order (words) and their attention's."""
    order = sorted(range(len(attention)), key=lambda i: -attention[i])
    attention_rank = {i: k for k, i in enumerate(order, 1)}
    return [1 / (FUSION_K + i + 1) + 1 / (FUSION_K + attention_rank[i]) for i in range(len(attention))]


def collect(name: str, session_for, n_candidates: int) -> list[dict]:
    import evidence as ev

    spec = json.loads((ev.QUESTIONS / f"{name}.json").read_text())
    session = session_for(common.corpus_dir() / spec["document"])
    spans, document = session.spans, session.document
    rows = []
    for question in spec["questions"]:
        if question.get("follow_up"):
            continue
        evidence = ev.evidence_of(document, question)
        selection = session.select(question["q"])
        candidates = [c.span for c in selection.ranked[:n_candidates]]
        is_evidence = [any(ev.covered(e, [(spans.spans[i].segment, spans.spans[i].char_start, spans.spans[i].char_end)])
                           for e in evidence) for i in candidates]
        row = {"set": name, "q": question["q"], "candidates": len(candidates), "evidence_in_candidates": any(is_evidence)}
        if any(is_evidence):
            began = time.perf_counter()
            masses = score_candidates(session, probe_queries(session, question["q"]), spans, candidates)
            row.update(words_rank=is_evidence.index(True) + 1, probe_s=time.perf_counter() - began,
                       masses=masses, is_evidence=is_evidence)
        rows.append(row)
        print(f"[{name}] {question['q'][:60]!r} words rank {row.get('words_rank')}", flush=True)
    return rows


def head_hits(rows: list[dict]):
    """`[layers, kv_heads, group]` count of questions whose evidence that head alone ranks first."""
    import torch

    layers = len(rows[0]["masses"])
    table = None
    for row in rows:
        for layer in range(layers):
            mass = row["masses"][layer]
            if table is None:
                table = torch.zeros((layers, *mass.shape[:2]))
            for h in range(mass.shape[0]):
                for g in range(mass.shape[1]):
                    table[layer, h, g] += rank_of_evidence(mass[h, g].tolist(), row["is_evidence"]) == 1
    return table


def best_head(rows: list[dict]) -> tuple[int, int, int]:
    table = head_hits(rows)
    flat = int(table.flatten().argmax())
    _, heads, group = table.shape
    return flat // (heads * group), (flat // group) % heads, flat % group


def summarise(rows: list[dict], sets: list[str]) -> tuple[list[dict], list[dict]]:
    scored = [r for r in rows if r["evidence_in_candidates"]]
    per_question, table = [], []
    for name in sets:
        mine = [r for r in scored if r["set"] == name]
        others = [r for r in scored if r["set"] != name and r["set"].split("-")[0] != name.split("-")[0]]
        if not mine:
            continue
        cross = best_head(others) if others else None
        own = best_head(mine)
        ranks = {"words": [], "all heads": [], "best head (other documents)": [], "best head (this set)": [],
                 "fused (other documents' head)": []}
        for row in mine:
            masses = row["masses"]
            total = sum(m.sum(dim=(0, 1)) for m in masses.values()).tolist()
            ranks["words"].append(row["words_rank"])
            ranks["all heads"].append(rank_of_evidence(total, row["is_evidence"]))
            for label, head in (("best head (other documents)", cross), ("best head (this set)", own)):
                if head is not None:
                    ranks[label].append(rank_of_evidence(masses[head[0]][head[1], head[2]].tolist(), row["is_evidence"]))
            if cross is not None:
                fused = fused_scores(masses[cross[0]][cross[1], cross[2]].tolist())
                ranks["fused (other documents' head)"].append(rank_of_evidence(fused, row["is_evidence"]))
            per_question.append({"set": name, "q": row["q"], "words_rank": row["words_rank"],
                                 "all_heads_rank": ranks["all heads"][-1], "probe_s": round(row["probe_s"], 3)})
        for arm, values in ranks.items():
            if values:
                head = cross if "other" in arm else own if "this set" in arm else None
                table.append({"set": name, "arm": arm, "head": f"layer {head[0]} kv {head[1]} q {head[2]}" if head else "",
                              "questions": len(values), "evidence_first": sum(v == 1 for v in values),
                              "evidence_top3": sum(v <= 3 for v in values), "mean_rank": round(sum(values) / len(values), 1)})
    return per_question, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", dest="sets", help=f"question set (default: {', '.join(SETS)})")
    parser.add_argument("--candidates", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="attention_rank")
    args = parser.parse_args()
    common.setup(args.threads)

    from engine.models.loader import load_model
    from engine.prefix_store import PrefixStore
    from engine.session import DocumentSession
    from engine.settings import EngineSettings
    from engine.workspace import prefix_store_dir

    settings = EngineSettings(threads=args.threads)
    model = load_model(settings.model, device=settings.device, weights=settings.weights)
    store = PrefixStore(prefix_store_dir(), disk_budget_bytes=max(settings.prefix_cache_disk_bytes, 8 * 2**30))
    sessions: dict = {}

    def session_for(path):
        if path not in sessions:
            session = DocumentSession(model, settings, store)
            report = session.open(str(path))
            if session.opened.archive is None:
                raise SystemExit(f"{path}: no archive was kept; attention needs it")
            print(f"{path.name}: {report.document_tokens:,} tokens, prefix hit {report.prefix_hit}", flush=True)
            sessions[path] = session
        return sessions[path]

    sets = args.sets or list(SETS)
    rows = []
    for name in sets:
        rows += collect(name, session_for, args.candidates)
    per_question, table = summarise(rows, sets)
    meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "candidates": args.candidates, "model": model.label, "weights": model.weights_label}
    common.write_results(args.name, per_question, list(per_question[0]), meta)
    common.write_results(f"{args.name}_summary", table, list(table[0]), meta)


if __name__ == "__main__":
    main()
