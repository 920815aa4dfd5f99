"""Span recall: bring back chosen stretches of the document whole, the same in every layer.

At book length the per-layer block selection of `engine.kvcache.recall` rarely agrees on the page
that answers a question (it found it in a median of 15 of 90 layer / KV-head pairs at 131k
tokens); the question's words do much better (`engine.evidence.text_index`). So the session chooses spans
(pages, parts of files) once, from the full-text index, and this hook recalls exactly those
tokens from the archive in every layer and KV head, in document order (or the reading budget's
order: `best_last`), so the model reads contiguous text. The choice does not change while the
answer is decoded (`reselects` False): no re-scoring per answer token, the recalled tokens are read
once per question.

Without an archive (it does not fit the prefix-cache disk budget, as for a 3B model at 128k
tokens), the chosen tokens are prefilled again from their token ids (`SpanCapture`) and recalled
the same way: a question then costs a prefill of its spans instead of disk space.

Focus (default): the held document tokens (the snapshot's heavy hitters, which are unrelated to
the question) are hidden and the recalled tokens are renumbered from position 0, so the model reads
[template head + instructions] [recalled spans] [template tail] [question], as if the document were
only those spans, but with the keys and values the whole-document read computed. Given only the
page that answers, the embedded model answered 7 of 9 book questions; given that page and its two
neighbours, 4 of 9: distractors cost as much as a missed page.
"""

from __future__ import annotations

import time

import torch

from engine.kvcache.archive import Archive
from engine.kvcache.recall import RecalledTokens, RecallHook, held_tokens


class SpanRecaller(RecallHook):
    """Recall the document tokens `tokens` (`[R]` stream positions, unique) in every layer.

    focus: hide the held document tokens (`RecalledTokens.focus_from` = the archive's length) and
    attend every recalled token, at positions 0..R-1 in the order of `tokens` (any order: the
    reading budget's `best_last` puts the best span last); otherwise `tokens` must be ascending,
    recalled tokens the layer already holds are masked out (not attended twice) and the held tokens
    stay visible, as block recall does.
    Raises ValueError for an empty, repeating or out-of-range `tokens`, or one not ascending without focus.
    """

    reselects = False

    def __init__(self, archive: Archive | None, tokens: torch.Tensor, *, focus: bool, n_tokens: int | None = None,
                 reread: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        n = archive.layout.n_tokens if archive is not None else n_tokens
        super().__init__(n)
        tokens = tokens.long().cpu()
        if tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= n:
            raise ValueError("span tokens must be document positions")
        if tokens.unique().numel() < tokens.numel() or (not focus and bool((tokens.diff() < 0).any())):
            raise ValueError("span tokens must be unique" + ("" if focus else " and ascending"))
        self.archive = archive
        self.n_tokens = n
        self.tokens = tokens
        self.focus = focus
        self._reread = reread
        self._current: dict[int, RecalledTokens] = {}

    @classmethod
    def reread(cls, keys_values: dict[int, tuple[torch.Tensor, torch.Tensor]], tokens: torch.Tensor, n_tokens: int) -> SpanRecaller:
        """Span recall without an archive: `keys_values[layer]` = (keys before RoPE, values), each
        `[kv_heads, R, head_dim]`, of the prefix tokens `tokens` `[R]` (in reading order), computed by
        prefilling just those tokens at positions 0..R-1 (`SpanCapture`). Always in focus: positions
        0..R-1 are the ones the keys were computed at, and nothing else of the document is read."""
        return cls(None, tokens, focus=True, n_tokens=n_tokens, reread=keys_values)

    def recall(self, layer: int, held_index: torch.Tensor, query: torch.Tensor, start: int, dtype: torch.dtype,
               compact: bool = False) -> RecalledTokens:
        """The recalled tokens of `layer` (read from the archive at the first call, the same object
        after). `query`, `start` and `compact` are not used: the choice was made before."""
        found = self._current.get(layer)
        if found is not None:
            return found
        began = time.perf_counter()
        device = query.device
        if self._reread is not None:
            keys, values = (t.to(dtype) for t in self._reread[layer])
            fields = {"k": keys, "v": values}  # what it holds, for the memory accounting
        else:
            index = self.tokens.expand(self.archive.layout.kv_heads, -1).contiguous()
            fields = self.archive.read(layer, index)
            keys, values = self.archive.decode(fields, dtype)
            self.stats.bytes_read += sum(t.nbytes for t in fields.values())
        index = self.tokens.expand(keys.shape[0], -1).contiguous()
        if self.focus:
            valid = torch.ones(index.shape, dtype=torch.bool)
        else:
            valid = ~torch.gather(held_tokens(held_index.cpu(), self.n_tokens), 1, index)
        recalled = RecalledTokens(
            index=index.to(device), valid=valid.to(device), keys=keys.to(device), values=values.to(device),
            fields={name: t.to(device) for name, t in fields.items()}, owner=self,
            focus_from=self.n_tokens if self.focus else None,
        )
        self._current[layer] = recalled
        self.stats.tokens_recalled += int(valid.sum())
        self.stats.read_s += time.perf_counter() - began
        return recalled


class SpanCapture:
    """Collects every layer's keys (before RoPE) and values while a few tokens are prefilled: the
    decoder's `archive` hook (`append(layer, start, key, value)`, key / value `[kv_heads, chunk,
    head_dim]`), used to re-read spans when the document has no archive."""

    def __init__(self) -> None:
        self._parts: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def append(self, layer: int, start: int, key: torch.Tensor, value: torch.Tensor) -> None:
        self._parts.setdefault(layer, []).append((key.detach().clone(), value.detach().clone()))

    def keys_values(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """layer -> (keys, values) `[kv_heads, tokens, head_dim]`, the chunks joined in order."""
        return {layer: (torch.cat([k for k, _ in parts], dim=1), torch.cat([v for _, v in parts], dim=1))
                for layer, parts in self._parts.items()}

