"""Child process that renders pages of a PDF or frames of an image and recognises their text (OCR).

Run as `python -m engine.documents.ocr_worker`; `engine.documents.ocr` starts it, sends one JSON
request on stdin and reads one JSON object per line from stdout. OCR runs here, not in the app's
process: the OCR engine (rapidocr-onnxruntime: PaddleOCR's PP-OCRv4 detection and recognition
models run by ONNX Runtime, models inside the wheel) loads OpenCV, whose Linux wheel brings its own
Qt plugins, and a page can take seconds, so cancel is a kill and memory is given back when the
process ends. One page is rendered, recognised and dropped at a time, so memory stays flat over a
2,000-page scan.

Request:  {"path": str, "kind": "pdf" | "image", "password": str | null, "pages": [0-based int],
           "threads": int, "memory_bytes": int}
Events:   {"event": "ready"}  (the engine is loaded)
          {"event": "page", "index": int, "width": float, "height": float,
           "lines": [[text, left, bottom, right, top, score], ...]}  (page units, y up: PDF points
           for a PDF page, pixels for an image)
          {"event": "error", "code": "unavailable" | "unreadable", "index": int | null, "detail": str}
          {"event": "done"}
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Iterator

from engine.documents.child_io import emit, limit_memory

MAX_SIDE_PX = 2000
"""Longest side, in pixels, of the image the recogniser is given: larger renders are scaled down
first. rapidocr scales anything larger down to 2,000 itself but then misreads long lines (CER 8.7 %
on a 300-dpi render of a P16 page against 1.2 % scaled down first; a 4,000-px limit gave 0.7 % at
four times the time): docs/BENCHMARKS.md §11."""

RENDER_DPI = 300
"""Resolution a scanned PDF page is rendered at before the MAX_SIDE_PX cap (a US Letter page is
then scaled to ~180 dpi)."""

REC_BATCH_LINES = 1
"""Text lines the recogniser reads in one run (rapidocr's default is 6)."""

MAX_IMAGE_PIXELS = 100_000_000
"""Decoded pixels an image frame may have (PIL's decompression-bomb limit is set to this here;
`engine.documents.image` refuses larger frames from their header before starting this process)."""


def load_engine(threads: int) -> Callable[[Any], list]:
    """The recogniser: image (H × W × 3 uint8 RGB numpy array) → rapidocr's rows
    [[4 corner points (x, y) in pixels], text, score]. Threads bounded to `threads` in ONNX Runtime
    and OpenCV. Raises ImportError when the OCR engine is not installed."""
    import cv2
    from rapidocr_onnxruntime import RapidOCR

    cv2.setNumThreads(threads)
    # use_cls off: the 180° classifier costs time on every line and pages arrive upright.
    engine = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1, use_cls=False,
                      max_side_len=MAX_SIDE_PX + 1)
    engine.text_rec.postprocess_op = SpacedDecoder(engine.text_rec.postprocess_op.character)
    # One line per recogniser run: a batch is padded to its widest line, and the padded columns
    # cost as much as text (2.4x the CPU seconds of batches of 6 on a 10-K and a book page).
    engine.text_rec.rec_batch_num = REC_BATCH_LINES
    _without_spinning(engine, threads)

    def recognise(image: Any) -> list:
        rows, _ = engine(image, use_cls=False)
        return rows or []

    return recognise


def _without_spinning(engine: Any, threads: int) -> None:
    """Give the detector and the recogniser ONNX Runtime sessions whose idle threads sleep instead
    of spinning: a spinning pool burns CPU between operators, which on a busy machine takes cores
    from the other pages' work and the app (26 % fewer CPU seconds per page measured side by side,
    same text). Otherwise the options rapidocr sets (all graph optimisations, no memory arena)."""
    from onnxruntime import GraphOptimizationLevel, InferenceSession, SessionOptions

    for holder in (engine.text_det.infer, engine.text_rec.session):
        model_path = getattr(holder.session, "_model_path", None)
        if not isinstance(model_path, str):
            continue  # another ONNX Runtime or rapidocr: keep its session as it is (slower, same text)
        options = SessionOptions()
        options.log_severity_level = 4
        options.enable_cpu_mem_arena = False
        options.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        holder.session = InferenceSession(model_path, sess_options=options,
                                          providers=["CPUExecutionProvider"])


class SpacedDecoder:
    """rapidocr's recogniser decoder (`CTCLabelDecode`) with spaces put back from the character
    positions (`engine.documents.ocr_spaces`): called by its TextRecognizer with a batch of
    recogniser outputs [lines, columns, classes] (softmax probabilities), returns [(text, score)]
    per line. `characters`: class index -> character, 0 the CTC blank, " " the space."""

    def __init__(self, characters: list[str]) -> None:
        self.character = characters
        self.space = characters.index(" ")

    def __call__(self, preds: Any, return_word_box: bool = False, **_: Any) -> list[tuple[str, float]]:
        from engine.documents.ocr_spaces import decode_line

        best, confidence = preds.argmax(axis=2), preds.max(axis=2)
        return [decode_line(best[line], confidence[line], preds[line, :, self.space], self.character)
                for line in range(preds.shape[0])]


def fit(image: Any) -> tuple[Any, float]:
    """(`image` (PIL) scaled down so its longest side is at most MAX_SIDE_PX, the factor from its
    pixels to the original's)."""
    from PIL import Image

    longest = max(image.size)
    if longest <= MAX_SIDE_PX:
        return image, 1.0
    factor = MAX_SIDE_PX / longest
    size = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
    return image.resize(size, Image.Resampling.LANCZOS), 1 / factor


def pdf_pages(path: str, password: str | None, indices: list[int]) -> Iterator[tuple[int, Any, float, float, Callable]]:
    """(index, PIL RGB image, page width, page height in points, pixel → page (x, y) mapping) for
    each of `indices`, rendered one at a time at RENDER_DPI."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(path, password=password)
    try:
        for index in indices:
            page = document[index]
            left, bottom, right, top = page.get_bbox()
            width, height = right - left, top - bottom
            scale = min(RENDER_DPI / 72, MAX_SIDE_PX / max(width, height, 1))
            image = page.render(scale=scale, may_draw_forms=True).to_pil().convert("RGB")
            page.close()

            def to_page(x: float, y: float, scale=scale, left=left, top=top) -> tuple[float, float]:
                return left + x / scale, top - y / scale

            yield index, image, width, height, to_page
    finally:
        document.close()


def image_frames(path: str, indices: list[int]) -> Iterator[tuple[int, Any, float, float, Callable]]:
    """As `pdf_pages` for the frames of an image file; page units are the frame's pixels."""
    from PIL import Image, ImageOps

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    with Image.open(path) as image:
        for index in indices:
            image.seek(index)
            frame = ImageOps.exif_transpose(image.convert("RGB") if image.mode != "RGB" else image.copy())
            width, height = frame.size
            fitted, factor = fit(frame)
            del frame

            def to_page(x: float, y: float, factor=factor, height=height) -> tuple[float, float]:
                return x * factor, height - y * factor

            yield index, fitted, float(width), float(height), to_page


def page_event(index: int, image: Any, width: float, height: float, to_page: Callable,
               recognise: Callable[[Any], list]) -> dict[str, Any]:
    """The "page" event for one rendered page: each recognised line's text, its box in page
    units (left, bottom, right, top; y up) and its score."""
    import numpy

    image, factor = fit(image)
    lines = []
    for corners, text, score in recognise(numpy.asarray(image)):
        xs = [point[0] * factor for point in corners]
        ys = [point[1] * factor for point in corners]
        (left, top), (right, bottom) = to_page(min(xs), min(ys)), to_page(max(xs), max(ys))
        lines.append([str(text), round(left, 2), round(bottom, 2), round(right, 2), round(top, 2),
                      round(float(score), 4)])
    return {"event": "page", "index": index, "width": round(width, 2), "height": round(height, 2), "lines": lines}


def run(request: dict[str, Any], emit: Callable[[dict[str, Any]], None] = emit) -> None:
    """Stream the events for one request (see the module docstring)."""
    threads = max(1, int(request.get("threads", 2)))
    try:
        recognise = load_engine(threads)
    except ImportError as exc:
        emit({"event": "error", "code": "unavailable", "index": None, "detail": str(exc)})
        return
    emit({"event": "ready"})
    indices = [int(i) for i in request["pages"]]
    pages = (pdf_pages(request["path"], request.get("password"), indices) if request["kind"] == "pdf"
             else image_frames(request["path"], indices))
    try:
        for index, image, width, height, to_page in pages:
            emit(page_event(index, image, width, height, to_page, recognise))
            del image
    except Exception as exc:  # noqa: BLE001 - a broken file or frame: the parent says which
        emit({"event": "error", "code": "unreadable", "index": None, "detail": f"{type(exc).__name__}: {exc}"})
        return
    emit({"event": "done"})


def main() -> int:
    """Read one request from stdin and stream events to stdout."""
    import warnings

    warnings.simplefilter("ignore")
    request = json.loads(sys.stdin.readline())
    threads = str(max(1, int(request.get("threads", 2))))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = threads  # before numpy and ONNX Runtime load
    limit_memory(int(request.get("memory_bytes", 0)))
    run(request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
