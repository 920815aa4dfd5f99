"""The sidebar's memory panel: the live gauge (`app.gauge.MemoryGauge`) and, under it, what the KV
budget in Settings means in bytes. The texts are pure functions of the settings, the model's
`ModelProfile` and the last `MemoryReport`, so the document header can show the same estimate.

Two numbers, named the same everywhere: the KV cache *at rest* (what one document keeps once read:
`Estimate.compressed_bytes` at the budget) and its *peak* (budget + one 16-bit prefill chunk, plus
what a question may recall: `engine.estimate.kv_peak_bytes`, the gauge's mark).
"""

from __future__ import annotations

from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.gauge import MemoryGauge
from app.untrusted import plain_label
from engine.errors import HalamanError
from engine.estimate import estimate, kv_peak_bytes
from engine.memory import MemoryReport
from engine.models.profile import ModelProfile
from engine.recall_plan import RecallSource, plan_recall
from engine.settings import EngineSettings
from engine.units import format_bytes, size_ratio


def budget_text(settings: EngineSettings, profile: ModelProfile) -> str:
    """"A document keeps at most 33.0 MiB of memory (4,096 tokens), whatever its length; 48.1 MiB at
    the peak … Recall …", in plain words (`budget_tip` holds the cache policy's terms).
    Raises HalamanError for settings the estimate refuses."""
    policy = settings.cache
    at_budget = estimate(profile, policy, policy.budget_tokens, settings.recall)
    recall = (f" Recall brings back up to {settings.recall.recall_tokens:,} tokens per question "
              f"(+{format_bytes(at_budget.recall_bytes)} while answering)." if at_budget.recall_bytes else " Recall is off.")
    return (f"A document keeps at most {format_bytes(at_budget.compressed_bytes)} of memory "
            f"({policy.budget_tokens:,} tokens), whatever its length; "
            f"{format_bytes(kv_peak_bytes(profile, policy, settings.recall))} at the peak "
            f"(reading a chunk, or answering with recall).{recall}")


def budget_tip(settings: EngineSettings) -> str:
    """The terms behind `budget_text`, for whoever wants them: the KV budget and its policy."""
    policy = settings.cache
    return (f"KV cache budget {policy.budget_tokens:,} tokens per layer and KV head: sink {policy.sink_tokens} + "
            f"window {policy.window_tokens:,} + heavy hitters, INT{policy.kv_bits} (Settings › Advanced).")


def document_estimate(settings: EngineSettings, profile: ModelProfile, tokens: int, memory: MemoryReport | None) -> str:
    """The KV estimate for a document of `tokens` tokens, in plain words ("memory once read"), its
    archive as its recall plan has it (`engine.recall_plan`), and whether it fits the free memory."""
    try:
        est = estimate(profile, settings.cache, tokens, settings.recall)
    except HalamanError as exc:
        return str(exc)
    text = (f"memory once read: ≈ {format_bytes(est.compressed_bytes)} "
            f"({size_ratio(est.full_bytes, est.compressed_bytes)} than the {format_bytes(est.full_bytes)} uncompressed)")
    plan = plan_recall(settings, profile, tokens,
                       disk_budget_bytes=settings.prefix_cache_disk_bytes if settings.prefix_cache else None)
    if plan.uses_archive:
        text += f" · archive on disk: {format_bytes(est.archive_bytes)}"
    elif plan.source is RecallSource.REREAD:
        text += " · no archive (over the disk budget): questions re-read their pages"
    if memory is not None:
        if est.peak_bytes <= memory.device_free_bytes:
            full = "a full cache would fit too" if est.full_bytes <= memory.device_free_bytes else "a full cache would not"
            text += f" — fits in the {format_bytes(memory.device_free_bytes)} free ({full})"
        else:
            text += f" — does NOT fit in the {format_bytes(memory.device_free_bytes)} free: lower the budget"
    return text


class MemoryPanel(QWidget):
    """Gauge + budget text. `show_report` redraws the gauge; `show_budget` the text."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.gauge = MemoryGauge()
        self.budget = plain_label()
        self.budget.setObjectName("estimate")
        self.budget.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.gauge)
        layout.addWidget(self.budget)

    def show_report(self, report: MemoryReport) -> None:
        self.gauge.set_report(report)

    def show_budget(self, settings: EngineSettings, profile: ModelProfile) -> None:
        try:
            self.budget.setText(budget_text(settings, profile))
            self.budget.setToolTip(budget_tip(settings))
        except HalamanError as exc:
            self.budget.setText(str(exc))
