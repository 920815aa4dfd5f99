"""What the command line prints about an answer and a read: the progress bars, the cautions before
trusting an answer, the attended passages. Imports nothing from the other command modules (they
all import it)."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.settings import EngineSettings
from engine.units import format_duration


def answer_cautions(answer, settings: EngineSettings) -> list[str]:
    """What a reader should know before trusting a local answer, one plain line each: the model
    was unsure of its words (`engine.cloud.policy.low_confidence`), it named things the document
    does not contain (`engine.grounding.unsupported_note`), its documents hold text written as
    instructions to the model (`engine.grounding.instructions_note`). [] for a sound answer."""
    from engine.cloud.policy import low_confidence
    from engine.grounding import checked_unit, instructions_note, unsupported_note

    cautions = []
    if low_confidence(answer, settings):
        cautions.append(f"low confidence: the model was unsure of its words ({answer.mean_logprob:.2f} per token)")
    if answer.unsupported:
        cautions.append(unsupported_note(answer.unsupported))
    if answer.instructions:
        # Checked against what the document has: "the page" of a PDF, "the passage" of a .docx.
        cautions.append(instructions_note(answer.instructions, checked_unit([*answer.sources, *answer.passages])))
    return cautions


class ProgressBar:
    """tqdm bars on stderr: one per phase; during prefill the session's own tokens/s and time left
    (`Progress.tokens_per_s` / `eta_s`, from `PrefillClock`), not tqdm's: the first event arrives
    after the first chunk is done, so tqdm's clock would count that chunk as free (a 562-token
    file showed 2.2k tokens/s against the report's 364)."""

    PREFILL_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self) -> None:
        self._bar = None
        self._phase = None

    def update(self, progress) -> None:
        from tqdm import tqdm

        from engine.progress import Phase

        if progress.phase is not self._phase:
            self.close()
            self._phase = progress.phase
            if progress.phase in (Phase.PREFILL, Phase.READING) and progress.total > 1:
                prefill = progress.phase is Phase.PREFILL
                self._bar = tqdm(total=progress.total, unit=f" {progress.unit}", desc=progress.phase.value, file=sys.stderr,
                                 unit_scale=progress.unit == "tokens", dynamic_ncols=True, smoothing=0,
                                 bar_format=self.PREFILL_FORMAT if prefill else None)
        if self._bar is not None:
            if progress.phase is Phase.PREFILL:
                self._bar.set_postfix_str(prefill_rate_text(progress), refresh=False)
            self._bar.update(progress.done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def attended_spans_text(answer, document) -> str:
    """`--show-spans`' lines: one attended passage a line, or why there is none."""
    from engine.attended import PASSAGE_MIN_SHARE, describe

    if answer.passages:
        return "\n                ".join(describe(p, document, file_lines=_file_lines(document, p.segment_index))
                                         for p in answer.passages)
    if answer.sources:  # block recall spreads the attention over many tokens: no line reaches the floor
        return f"none: no sentence or line got {PASSAGE_MIN_SHARE:.0%} of the recalled attention"
    return "none (recall off, or nothing recalled was attended)"


def _file_lines(document, index: int) -> list[int] | None:
    """The file's own line numbers for segment `index` of a folder or a text file (None for a PDF
    page, or when the file no longer aligns with what was read)."""
    from engine.documents.lines import file_line_numbers

    segment = document.segments[index]
    if document.kind == "pdf":
        return None
    path = Path(document.source) / segment.path if segment.path else Path(document.source)
    return file_line_numbers(path, segment.text)


def prefill_rate_text(progress) -> str:
    """'364 tokens/s, 1 min 05 s left' from a prefill `Progress` (empty parts left out; tqdm puts
    ', ' before it)."""
    parts = []
    if progress.tokens_per_s > 0:
        parts.append(f"{progress.tokens_per_s:,.0f} tokens/s")
    if progress.eta_s is not None:
        parts.append(f"{format_duration(progress.eta_s)} left")
    return ", ".join(parts)
