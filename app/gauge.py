"""The live memory gauge: what the weights, the KV cache and the rest of Halaman hold on the device.

Two bars from one `engine.memory.MemoryReport`:

    device   [ weights | KV cache | runtime | other processes |        free        ]
                                 ^ peak mark: where the KV cache may grow to (budget + one chunk + recall)
    KV cache [ codes | scales+zeros | 16-bit sinks+residual | scores+positions+table | recalled | pool free ]  / budget

"recalled" is what the current question brought back from the document's archive on disk
(`MemoryBreakdown.recalled_bytes`, engine.kvcache.recall): held beside the snapshot only while a
question is answered, so it gets its own colour and legend line rather than being folded into the
codes. The peak mark includes the most a question may recall.

"runtime" is `MemoryReport.workspace_bytes`: what the process holds beyond weights and KV cache.
On the CPU that is Python, PyTorch and their buffers (resident memory, about 1 GiB before any
document is open); on a GPU, activations and the allocator's cache. It is called what it is, not
"workspace", which users took for the document's share.

The device bar turns amber at AMBER_AT of the device in use and red at RED_AT (on the GPU that is
`torch.cuda.mem_get_info`; on the CPU system RAM). The tooltip gives every number in exact bytes.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QHBoxLayout, QSizePolicy, QVBoxLayout, QWidget

from app.untrusted import plain_label, rich_label
from engine.memory import MemoryReport
from engine.units import format_bytes

AMBER_AT = 0.80
RED_AT = 0.92

COLORS = {
    "weights": QColor("#4C78A8"),
    "kv": QColor("#8E5CC7"),
    "codes": QColor("#8E5CC7"),
    "meta": QColor("#B48AE0"),
    "residual": QColor("#6B3FA0"),
    "index": QColor("#D3BDF0"),
    "recalled": QColor("#F28E2B"),   # not a purple: it is not part of the snapshot
    "pool_free": QColor("#EDE3F8"),
    "workspace": QColor("#54A24B"),
    "other": QColor("#B0B0B0"),
    "free": QColor("#F4F4F4"),
}
LEVEL_COLORS = {"ok": QColor("#3A7D44"), "amber": QColor("#E09B00"), "red": QColor("#D62728")}


def level_for(report: MemoryReport) -> str:
    """"ok", "amber" or "red" by the share of the device in use."""
    used = report.used_fraction
    return "red" if used >= RED_AT else "amber" if used >= AMBER_AT else "ok"


def device_segments(report: MemoryReport) -> list[tuple[str, int]]:
    """(name, bytes) along the device bar; sums to device_total_bytes (other processes absorb the rest)."""
    total = report.device_total_bytes
    ours = report.weights_bytes + report.kv_bytes + report.workspace_bytes
    used = max(0, total - report.device_free_bytes)
    return [
        ("weights", report.weights_bytes),
        ("kv", report.kv_bytes),
        ("workspace", report.workspace_bytes),
        ("other", max(0, used - ours)),
        ("free", report.device_free_bytes),
    ]


def kv_segments(report: MemoryReport) -> list[tuple[str, int]]:
    """(name, bytes) along the KV bar: the snapshot's parts, the recalled tokens, the pool's free blocks."""
    kv = report.kv
    return [
        ("codes", kv.codes_bytes),
        ("meta", kv.quant_meta_bytes),
        ("residual", kv.residual_bytes),
        ("index", kv.score_bytes + kv.position_bytes + kv.block_table_bytes),
        ("recalled", kv.recalled_bytes),
        ("pool_free", kv.pool_free_bytes),
    ]


def tooltip_for(report: MemoryReport) -> str:
    """HTML table of every number of the report, in exact bytes."""
    kv = report.kv
    rows = [
        ("Device", report.device),
        ("Device total", report.device_total_bytes), ("Device free", report.device_free_bytes),
        ("Weights", report.weights_bytes), ("KV cache", report.kv_bytes),
        ("&nbsp;&nbsp;quantized codes", kv.codes_bytes), ("&nbsp;&nbsp;scales + zero points", kv.quant_meta_bytes),
        ("&nbsp;&nbsp;16-bit sinks + residual", kv.residual_bytes), ("&nbsp;&nbsp;scores", kv.score_bytes),
        ("&nbsp;&nbsp;positions", kv.position_bytes), ("&nbsp;&nbsp;block table", kv.block_table_bytes),
        ("&nbsp;&nbsp;recalled for this question", kv.recalled_bytes),
        ("&nbsp;&nbsp;pool, free blocks", kv.pool_free_bytes),
        ("KV cache at its peak", report.budget_bytes), ("Runtime (Python, PyTorch, buffers)", report.workspace_bytes),
    ]
    cells = "".join(
        f"<tr><td>{name}</td><td align='right'>{value if isinstance(value, str) else f'{value:,} bytes'}</td></tr>"
        for name, value in rows
    )
    return f"<table>{cells}</table><p>{report.used_fraction:.1%} of the device in use</p>"


class _Bar(QWidget):
    """One horizontal bar of (name, bytes) segments against `total`, with an optional mark."""

    def __init__(self, height: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.segments: list[tuple[str, int]] = []
        self.total = 0
        self.mark: int | None = None
        self.outline = QColor("#C8C8C8")
        self.min_px = 0.0
        self.setFixedHeight(height)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(240, self.height())

    def set_data(self, segments: list[tuple[str, int]], total: int, *, mark: int | None = None,
                 outline: QColor | None = None, min_px: float = 0.0) -> None:
        self.segments, self.total, self.mark, self.min_px = segments, total, mark, min_px
        self.outline = outline or QColor("#C8C8C8")
        self.update()

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(1.5, 1.5, self.width() - 3, self.height() - 3)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(COLORS["free"])
        painter.drawRoundedRect(rect, 4, 4)
        if self.total > 0:
            x = rect.left()
            for name, value in self.segments:
                if value <= 0 or name == "free":
                    continue
                width = min(max(self.min_px, value / self.total * rect.width()), rect.right() - x)
                painter.setBrush(COLORS[name])
                painter.drawRect(QRectF(x, rect.top(), width, rect.height()))
                x += width
            if self.mark:
                mx = rect.left() + min(self.mark / self.total, 1.0) * rect.width()
                painter.setPen(QPen(QColor("#222222"), 2))
                painter.drawLine(QPointF(mx, 0), QPointF(mx, self.height()))
        painter.setPen(QPen(self.outline, 1.5))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(rect, 4, 4)
        painter.end()


def _swatch(name: str) -> str:
    if name == "free":
        return "<span style='color:#B8B8B8'>□</span>"
    return f"<span style='color:{COLORS[name].name()}'>■</span>"


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><td width='50%'>{a}</td><td width='50%'>{b}</td></tr>" for a, b in rows)
    return f"<table cellspacing='0' cellpadding='0' width='100%'>{cells}</table>"


class MemoryGauge(QWidget):
    """The gauge widget. `set_report(report)` redraws; `report`, `level` and `updates` are for tests."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.report: MemoryReport | None = None
        self.level = "ok"
        self.updates = 0
        self.title = plain_label("Memory")
        self.title.setObjectName("gaugeTitle")
        self.used = rich_label()
        self.used.setObjectName("gaugeUsed")
        self.device_bar = _Bar(18)
        self.legend = rich_label()
        self.legend.setText("No model loaded yet.")
        self.legend.setObjectName("gaugeLegend")
        self.kv_title = plain_label()
        self.kv_title.setObjectName("gaugeTitle")
        self.kv_bar = _Bar(12)
        self.kv_legend = rich_label()
        self.kv_legend.setObjectName("gaugeLegend")
        for label in (self.title, self.used, self.legend, self.kv_title, self.kv_legend):
            label.setWordWrap(True)  # the sidebar can be narrow: wrap, never clip ("KV cache 37.1 Mi…")
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.used)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(3)
        layout.addLayout(top)
        layout.addWidget(self.device_bar)
        layout.addWidget(self.legend)
        layout.addSpacing(4)
        layout.addWidget(self.kv_title)
        layout.addWidget(self.kv_bar)
        layout.addWidget(self.kv_legend)
        self.device_bar.hide()
        self.kv_bar.hide()

    def set_report(self, report: MemoryReport | None) -> None:
        self.report = report
        self.updates += 1
        if report is None:
            self.title.setText("Memory")
            self.used.setText("")
            self.legend.setText("No model loaded yet.")
            self.kv_title.setText("")
            self.kv_legend.setText("")
            self.device_bar.set_data([], 0)
            self.kv_bar.set_data([], 0)
            self.device_bar.hide()  # two empty bars before the model loads read as a broken gauge
            self.kv_bar.hide()
            self.setToolTip("")
            return
        self.level = level_for(report)
        color = LEVEL_COLORS[self.level]
        self.title.setText(f"Memory · {report.device}")
        warning = {"ok": "", "amber": " · nearly full", "red": " · almost out of memory"}[self.level]
        self.used.setText(f"<span style='color:{color.name()}; font-weight:600'>{report.used_fraction:.0%} used{warning}</span>")
        self.device_bar.show()
        self.kv_bar.show()
        self.device_bar.set_data(device_segments(report), report.device_total_bytes,
                                 mark=report.weights_bytes + report.budget_bytes if report.budget_bytes else None,
                                 outline=color, min_px=2)
        other = dict(device_segments(report))["other"]
        self.legend.setText(_table([
            (f"{_swatch('weights')} weights {format_bytes(report.weights_bytes)}", f"{_swatch('kv')} KV cache {format_bytes(report.kv_bytes)}"),
            (f"{_swatch('workspace')} runtime {format_bytes(report.workspace_bytes)}", f"{_swatch('other')} others {format_bytes(other)}"),
            (f"{_swatch('free')} free {format_bytes(report.device_free_bytes)} of {format_bytes(report.device_total_bytes)}", ""),
        ]))
        kv = report.kv
        over = bool(report.budget_bytes) and report.kv_bytes > report.budget_bytes
        self.kv_title.setText(f"KV cache {format_bytes(report.kv_bytes)} · peak {format_bytes(report.budget_bytes)}")
        self.kv_bar.set_data(kv_segments(report), max(report.budget_bytes, report.kv_bytes, 1),
                             outline=LEVEL_COLORS["red"] if over else None)
        self.kv_legend.setText(_table([
            (f"{_swatch('codes')} codes {format_bytes(kv.codes_bytes)}", f"{_swatch('meta')} scales {format_bytes(kv.quant_meta_bytes)}"),
            (f"{_swatch('residual')} 16-bit {format_bytes(kv.residual_bytes)}",
             f"{_swatch('index')} scores etc. {format_bytes(kv.score_bytes + kv.position_bytes + kv.block_table_bytes)}"),
            (f"{_swatch('recalled')} recalled for this question {format_bytes(kv.recalled_bytes)}", ""),
        ]))
        self.setToolTip(tooltip_for(report))
