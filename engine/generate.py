"""Decoding an answer: functions of (decoder, cache, decoding settings), no session state.

    built = AnswerBuilder(tokenizer, began, on_text, lookup)
    logits = decoder.prefill(question_ids, cache, recaller=recaller)      # [1, vocab]
    stop = decode_answer(decoder, cache, logits, built, decoding, recaller=recaller)

`answer_frame` is the one answer frame around them that a document's question
(`engine.session.DocumentSession.ask`) and a library's (`engine.open_library.OpenLibrary.ask`) both
call: clock, thread governor, recall, decoding, release, sources, the `Answer`.

Shaped after gpt-fast's generate.py (github.com/pytorch-labs/gpt-fast): `pick` chooses a token from
logits, `decode_one` feeds one token, `decode_answer` loops until a stop token or the length limit.
`speculative_step` checks a draft from the document in one pass (prompt lookup decoding: Saxena,
"Prompt Lookup Decoding", 2023, github.com/apoorvumang/prompt-lookup-decoding; drafts come from
`engine.prompt_lookup`), keeping exactly what greedy decoding would produce.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.answer import Answer, DraftStats, Source, StopReason
from engine.errors import Cancelled
from engine.kvcache.cache import CompressedCache
from engine.kvcache.recall import RecallHook
from engine.models.decoder import ChunkTaps, CompressedDecoder
from engine.prompt_lookup import PromptLookup
from engine.recall_plan import REREAD_RECALL_TOKENS, recall_budget  # noqa: F401 - torch-free home; callers import them here
from engine.reasoning import ReasoningSplitter, Split, split_reasoning
from engine.threads import ThreadGovernor

# Recall selects again with the answer's own query at each of the first RECALL_EVERY_TOKEN_UNTIL
# answer tokens, then every RECALL_REFRESH_TOKENS: the token before a fact ("... the archive room
# is") finds it in layers where the question's queries did not (8k needle: a refresh every 4 tokens
# missed it, every token found it). Facts come early in short answers; each refresh costs one
# selection (scoring + reading).
RECALL_EVERY_TOKEN_UNTIL = 16
RECALL_REFRESH_TOKENS = 8
# Prompt-lookup drafts start at this length, then grow by 2 after a fully accepted draft and shrink
# by 1 after a miss, between 1 and `Decoding.draft_tokens`.
DRAFT_START_TOKENS = 4
# Answer tokens between two thread decisions (`ThreadGovernor.step`): a step costs two psutil reads,
# and the governor measures only once half a second has passed, so this just bounds the overhead.
GOVERNOR_EVERY_TOKENS = 4


@dataclass(frozen=True)
class Decoding:
    """How an answer is decoded.

    stop_ids: token ids that end the answer (`stop_token_ids`); never emitted.
    max_new_tokens: the answer's length limit, in tokens.
    temperature: 0 = greedy; above 0, sampled from softmax(logits / temperature).
    repetition_penalty: CTRL-style (Keskar et al. 2019, arXiv:1909.05858) on tokens already in the
        answer; 1 = off.
    draft_tokens: the longest prompt-lookup draft checked in one pass; 0 = no drafting.
    reuse_workspace: keep the dequantized cache between decode steps (`LayerKV.attend`; worth it
        on a CPU).
    """

    stop_ids: frozenset[int]
    max_new_tokens: int
    temperature: float = 0.0
    repetition_penalty: float = 1.0
    draft_tokens: int = 0
    reuse_workspace: bool = False

    @classmethod
    def of(cls, settings, stop_ids: frozenset[int], *, reuse_workspace: bool, max_new_tokens: int | None = None) -> Decoding:
        """The decoding `settings` (`engine.settings.EngineSettings`) ask for; `max_new_tokens`
        overrides theirs for one answer."""
        return cls(stop_ids=stop_ids, max_new_tokens=max_new_tokens or settings.max_new_tokens,
                   temperature=settings.temperature, repetition_penalty=settings.repetition_penalty,
                   draft_tokens=settings.draft_tokens, reuse_workspace=reuse_workspace)

    @property
    def drafts(self) -> bool:
        """Whether prompt-lookup drafts are checked: only in greedy decoding, whose output they keep."""
        return self.draft_tokens > 0 and self.temperature <= 0


def decoding_for(model, settings, stop_ids: frozenset[int], max_new_tokens: int | None = None) -> Decoding:
    """How `model` (`engine.models.loader.LoadedModel`) decodes answers with `settings`
    (`Decoding.of`): on the CPU it keeps the dequantized cache between steps (dequantizing and
    rotating the whole cache dominated each step; a GPU does it fast enough to keep its memory for
    the budget instead: `LayerKV.attend`). `max_new_tokens` overrides the settings' length limit."""
    return Decoding.of(settings, stop_ids, reuse_workspace=model.device.type == "cpu", max_new_tokens=max_new_tokens)


def refresh_recall(answer_tokens: int) -> bool:
    """Whether recall selects again before feeding answer token number `answer_tokens` (1-based)."""
    return answer_tokens <= RECALL_EVERY_TOKEN_UNTIL or answer_tokens % RECALL_REFRESH_TOKENS == 0


def pick(logits: torch.Tensor, generated: list[int], *, temperature: float = 0.0,
         repetition_penalty: float = 1.0) -> tuple[int, float]:
    """The next token after `logits` `[n, vocab]` (its last row): greedy (`temperature` 0) or
    sampled, after a repetition penalty on the tokens of `generated` (the answer so far). Returns
    (token id, its log-probability under the unpenalized logits at temperature 1)."""
    scores = logits[-1].clone()
    if repetition_penalty != 1.0 and generated:
        seen = torch.tensor(sorted(set(generated)), device=scores.device)
        picked = scores[seen]
        scores[seen] = torch.where(picked > 0, picked / repetition_penalty, picked * repetition_penalty)
    logprobs = torch.log_softmax(logits[-1].float(), dim=-1)
    if temperature > 0:
        probs = torch.softmax(scores / temperature, dim=-1)
        token = int(torch.multinomial(probs, 1))
    else:
        token = int(scores.argmax())
    return token, float(logprobs[token])


def decode_one(decoder: CompressedDecoder, token: int, cache: CompressedCache, *,
               cancel: threading.Event | None = None, reuse_workspace: bool = False,
               recaller: RecallHook | None = None) -> torch.Tensor:
    """One decode step: feed `token` into `cache`, return the next logits `[1, vocab]` (float32).
    With `recaller`, recall selects again with this token's query. Raises Cancelled."""
    return decoder.forward(
        torch.tensor([token]), cache, slack_tokens=cache.decode_slack, cancel=cancel,
        reuse_workspace=reuse_workspace, taps=ChunkTaps(recaller=recaller) if recaller is not None else None,
    )


def draft_room(cache: CompressedCache, answered: int, limit: int, draft_tokens: int, recalling: bool) -> int:
    """How many draft tokens the next pass may check after `answered` answer tokens: at most
    `draft_tokens`, within the answer's length `limit`, with no flush or eviction of `cache` inside
    the pass (that would make it differ from one-token decoding), and, when `recalling`, no recall
    refresh due inside it (a refresh runs on a one-token pass). May be 0 or less: no draft."""
    room = min(draft_tokens, limit - answered, cache.tokens_until_compress(cache.decode_slack) - 1)
    if recalling:
        for ahead in range(1, room + 1):
            if refresh_recall(answered + ahead):
                return ahead - 1
    return room


def speculative_step(decoder: CompressedDecoder, token: int, proposal: list[int], cache: CompressedCache,
                     built: AnswerBuilder, decoding: Decoding, cancel: threading.Event | None = None
                     ) -> tuple[torch.Tensor, int]:
    """Check `token` and the draft `proposal` (`len(proposal) + 1` tokens, no more than
    `cache.tokens_until_compress`) in one pass and keep the longest prefix of the draft that
    greedy decoding agrees with, emitting it to `built`; the cache keeps `token` and the accepted
    drafts, never a rejected one (`CompressedCache.commit`). Returns (logits `[1, vocab]` after the
    last kept token, drafts accepted). Raises Cancelled."""
    checked = decoder.forward(
        torch.tensor([token, *proposal]), cache, all_logits=True, cancel=cancel,
        reuse_workspace=decoding.reuse_workspace, pending=True,
    )  # [1 + len(proposal), vocab]
    accepted = 0
    for i, draft in enumerate(proposal):
        picked, picked_logprob = pick(checked[i : i + 1], built.generated, temperature=decoding.temperature,
                                      repetition_penalty=decoding.repetition_penalty)
        if picked != draft or picked in decoding.stop_ids:
            break
        built.emit(draft, picked_logprob)
        accepted += 1
    cache.commit(1 + accepted, cache.decode_slack)
    return checked[accepted : accepted + 1], accepted


def decode_answer(decoder: CompressedDecoder, cache: CompressedCache, logits: torch.Tensor, built: AnswerBuilder,
                  decoding: Decoding, *, recaller: RecallHook | None = None, cancel: threading.Event | None = None,
                  governor: ThreadGovernor | None = None) -> StopReason:
    """Decode after `logits` `[1, vocab]` (the question's last) until a stop token (END) or
    `decoding.max_new_tokens` answer tokens in `built` (MAX_TOKENS), each token emitted to `built`.
    `built.lookup` (greedy decoding only) drafts tokens to check in one pass, counted in `built.drafts`.
    `recaller` (one that `reselects`) selects again on the answer's own tokens (`refresh_recall`).
    `governor` re-decides the CPU threads every `GOVERNOR_EVERY_TOKENS` tokens, so an answer that
    started beside a busy process takes the freed core back (`engine.threads`).
    Raises Cancelled (what was emitted stays in `built`) and whatever the decoder raises."""
    reselecting = recaller is not None and recaller.reselects
    lookup, limit = built.lookup, decoding.max_new_tokens
    draft_length = min(DRAFT_START_TOKENS, decoding.draft_tokens)
    while len(built.generated) < limit:
        token, logprob = pick(logits, built.generated, temperature=decoding.temperature,
                              repetition_penalty=decoding.repetition_penalty)
        if token in decoding.stop_ids:
            return StopReason.END
        built.emit(token, logprob)
        if governor is not None and len(built.generated) % GOVERNOR_EVERY_TOKENS == 0:
            governor.step()
        refresh = reselecting and refresh_recall(len(built.generated))
        if refresh:
            recaller.stats.refreshes += 1
        proposal = [] if refresh or lookup is None else lookup.propose(
            min(draft_length, draft_room(cache, len(built.generated), limit, decoding.draft_tokens, reselecting)))
        if not proposal:
            logits = decode_one(decoder, token, cache, cancel=cancel, reuse_workspace=decoding.reuse_workspace,
                                recaller=recaller if refresh else None)
            continue
        logits, accepted = speculative_step(decoder, token, proposal, cache, built, decoding, cancel)
        built.drafts.add(len(proposal), accepted)
        # transformers' heuristic for assisted decoding: longer drafts while they are all
        # accepted, shorter after a miss (a rejected token costs a little compute)
        draft_length = (min(draft_length + 2, decoding.draft_tokens) if accepted == len(proposal)
                        else max(1, draft_length - 1))
    return StopReason.MAX_TOKENS


class AnswerBuilder:
    """The answer being decoded: its tokens and log-probabilities, the text streamed so far (to
    `on_text`, with `<think>` blocks held back: `engine.reasoning`), time to first token and decode
    rate (seconds from `began`, a `time.perf_counter()`). `lookup`, when drafting, learns every
    emitted token, and `drafts` counts the drafts checked and accepted."""

    def __init__(self, tokenizer, began: float, on_text: Callable[[str], None] | None, lookup: PromptLookup | None) -> None:
        self.tokenizer = tokenizer
        self.began = began
        self.on_text = on_text
        self.lookup = lookup
        self.drafts = DraftStats()
        self.generated: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        self.ttft_s = 0.0
        self.decode_began: float | None = None
        self._splitter = ReasoningSplitter()

    def emit(self, token: int, logprob: float) -> None:
        """Add one answer token and stream the text it completes."""
        self.generated.append(token)
        self.logprobs.append(logprob)
        if self.lookup is not None:
            self.lookup.extend([token])
        if self.decode_began is None:
            self.ttft_s = time.perf_counter() - self.began
            self.decode_began = time.perf_counter()
        piece = self.tokenizer.decode(self.generated, skip_special_tokens=True)[len(self.text):]
        if piece and not piece.endswith("\ufffd"):  # wait for the rest of a split character
            self._stream(piece)

    def _stream(self, piece: str) -> None:
        self.text += piece
        shown, _ = self._splitter.feed(piece)
        if shown and self.on_text:
            self.on_text(shown)

    def finish(self) -> Split:
        """Stream what is left; the whole text split into answer and reasoning."""
        tail = self.tokenizer.decode(self.generated, skip_special_tokens=True)[len(self.text):]
        if tail:
            self._stream(tail)
        shown, _ = self._splitter.close()
        if shown and self.on_text:
            self.on_text(shown)
        return split_reasoning(self.text)

    def decode_tokens_per_s(self) -> float:
        seconds = time.perf_counter() - self.decode_began if self.decode_began else 0.0
        return (len(self.generated) - 1) / seconds if seconds and len(self.generated) > 1 else 0.0

    def mean_logprob(self) -> float:
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else 0.0


def stop_token_ids(tokenizer, generation_config=None) -> frozenset[int]:
    """End-of-turn ids: the tokenizer's EOS, `generation_config.eos_token_id` (an int or a list;
    transformers' `GenerationConfig`), and common chat end markers in the vocabulary."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eos = getattr(generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[marker] for marker in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>") if marker in vocab)
    return frozenset(i for i in ids if isinstance(i, int))


class QuestionRecall(Protocol):
    """Where one question's recalled tokens come from and where the attention they received goes
    back to (`engine.recall_source` for one document, `engine.open_library` for a library)."""

    def hook(self, cache: CompressedCache, governor: ThreadGovernor | None,
             cancel: threading.Event | None) -> RecallHook | None:
        """The recall hook the question is fed with (None: none), before the question is fed into
        `cache`. May take seconds (re-reading spans); raises Cancelled."""

    def sources(self, cache: CompressedCache, hook: RecallHook | None) -> tuple[list[Source], Any]:
        """After the answer: its sources and attended passages."""

    def unsupported(self, text: str, question: str) -> list[str]:
        """Names in the answer `text` that the documents read do not contain (`engine.grounding`)."""

    def instructions(self) -> list[str]:
        """Phrases of the documents read written as instructions to the model (`engine.grounding`)."""


@dataclass(frozen=True)
class Asked:
    """A question ready to answer: its text, its token ids `[Q]` after what `cache` holds, the cache
    it goes on (a fork of a snapshot, or a conversation's), the prompt's tokens in all,
    `prefix_hit` (`engine.open_document.OpenDocument.take_prefix_hit`: no document was read
    just for this answer), the prompt-lookup drafts (None: no drafting) and when it was asked
    (`time.perf_counter()`)."""

    question: str
    ids: list[int]
    cache: CompressedCache
    prompt_tokens: int
    prefix_hit: bool
    began: float
    lookup: PromptLookup | None = None


def answer_frame(decoder: CompressedDecoder, tokenizer, asked: Asked, recall: QuestionRecall, decoding: Decoding, *,
                 threads: int | None, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> tuple[Answer, Any]:
    """Answer `asked`, streaming text to `on_text`: recall by `recall`, prefill the question's token
    ids into its cache with that hook, decode the answer (`decode_answer`) by `decoding`, release
    the cache's decode workspace, map attention back to sources, and check the answer's names
    against the documents (`Answer.unsupported`) and name their instruction-like text
    (`Answer.instructions`), not for a cancelled answer.
    `threads`: the settings' CPU threads, re-decided while it runs (`ThreadGovernor`); None on a GPU.
    Returns (the answer, its attended passages as `recall.sources` gives them; `Answer.passages`
    is left empty for the caller). Cancelling keeps what was generated (stop_reason "cancelled");
    raises what the recall hook raises besides Cancelled (ArchiveError from a damaged block)."""
    # The cores free now, re-decided while the spans are re-read and the answer decodes.
    governor = ThreadGovernor(threads) if threads is not None else None
    built = AnswerBuilder(tokenizer, asked.began, on_text, asked.lookup)
    cache, hook = asked.cache, None
    try:
        # Inside the try: re-reading the chosen spans (tens of seconds on a slow CPU) stops on cancel.
        hook = recall.hook(cache, governor, cancel)
        logits = decoder.prefill(torch.tensor(asked.ids), cache, cancel=cancel, recaller=hook, governor=governor)
        if hook is not None:
            hook.stats.question_s = hook.stats.seconds
        stop = decode_answer(decoder, cache, logits, built, decoding, recaller=hook, cancel=cancel, governor=governor)
    except Cancelled:  # what was emitted stays in `built`
        stop = StopReason.CANCELLED
    finally:
        cache.release_workspace()
    split = built.finish()
    sources, passages = recall.sources(cache, hook)
    answer = Answer(
        question=asked.question, text=split.answer, token_ids=built.generated, prompt_tokens=asked.prompt_tokens,
        time_to_first_token_s=built.ttft_s, decode_tokens_per_s=built.decode_tokens_per_s(),
        prefix_hit=asked.prefix_hit, stop_reason=stop, mean_logprob=built.mean_logprob(), kv=cache.memory(),
        recall=hook.stats if hook is not None else None, sources=sources, drafts=built.drafts, reasoning=split.reasoning,
    )
    if stop is not StopReason.CANCELLED:
        answer.unsupported = recall.unsupported(answer.text, asked.question)
        answer.instructions = recall.instructions()
    return answer, passages
