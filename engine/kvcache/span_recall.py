"""Span recall: bring back chosen stretches of the document whole, the same in every layer.

At book length the per-layer block selection of `engine.kvcache.recall` rarely agrees on the page
that answers a question (it found it in a median of 15 of 90 layer / KV-head pairs at 131k
tokens); the question's words do much better (`engine.text_index`). So the session chooses spans
(pages, parts of files) once, from the full-text index, and this hook recalls exactly those
tokens from the archive in every layer and KV head, in document order, so the model reads
contiguous text. The choice does not change while the answer is decoded (`reselects` False): no
re-scoring per answer token, the recalled tokens are read once per question.

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
    """Recall the document tokens `tokens` (`[R]` stream positions, ascending, unique) in every layer.

    focus: hide the held document tokens (`RecalledTokens.focus_from` = the archive's length) and
    attend every recalled token; otherwise recalled tokens the layer already holds are masked out
    (not attended twice) and the held tokens stay visible, as block recall does.
    Raises ValueError for an empty, unsorted or out-of-range `tokens`.
    """

    reselects = False

    def __init__(self, archive: Archive, tokens: torch.Tensor, *, focus: bool) -> None:
        super().__init__(archive.layout.n_tokens)
        tokens = tokens.long().cpu()
        n = archive.layout.n_tokens
        if tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= n or bool((tokens.diff() <= 0).any()):
            raise ValueError("span tokens must be unique ascending document positions")
        self.archive = archive
        self.tokens = tokens
        self.focus = focus
        self._current: dict[int, RecalledTokens] = {}

    def recall(self, layer: int, held_index: torch.Tensor, query: torch.Tensor, start: int, dtype: torch.dtype,
               compact: bool = False) -> RecalledTokens:
        """The recalled tokens of `layer` (read from the archive at the first call, the same object
        after). `query`, `start` and `compact` are not used: the choice was made before."""
        found = self._current.get(layer)
        if found is not None:
            return found
        began = time.perf_counter()
        device = query.device
        heads = self.archive.layout.kv_heads
        index = self.tokens.expand(heads, -1).contiguous()
        fields = self.archive.read(layer, index)
        keys, values = self.archive.decode(fields, dtype)
        if self.focus:
            valid = torch.ones(index.shape, dtype=torch.bool)
        else:
            valid = ~torch.gather(held_tokens(held_index.cpu(), self.archive.layout.n_tokens), 1, index)
        recalled = RecalledTokens(
            index=index.to(device), valid=valid.to(device), keys=keys.to(device), values=values.to(device),
            fields={name: t.to(device) for name, t in fields.items()}, owner=self,
            focus_from=self.archive.layout.n_tokens if self.focus else None,
        )
        self._current[layer] = recalled
        self.stats.blocks_recalled = 0
        self.stats.tokens_recalled += int(valid.sum())
        self.stats.bytes_read += sum(t.nbytes for t in fields.values())
        self.stats.read_s += time.perf_counter() - began
        return recalled
