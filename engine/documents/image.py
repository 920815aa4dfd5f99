"""Images (PNG, JPEG, TIFF, BMP, WebP, GIF) as documents: each image, or each frame of a multi-page
TIFF, is a page whose text is recognised (`engine.documents.ocr`).

Only the header is read here (Pillow opens lazily): the frame sizes are checked against
`MAX_IMAGE_PIXELS` before any bitmap is decoded, so a 20,000 × 20,000 image is refused in
milliseconds with one line instead of taking 1.2 GB. Decoding happens in the OCR process, one
frame at a time, under its memory cap.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

from engine.documents.document import (
    Document, FileNotReadableError, NoTextLayerError, ProgressCallback, Segment, os_reason,
)
from engine.documents.names import display_name
from engine.documents.ocr_worker import MAX_IMAGE_PIXELS
from engine.documents.text import normalize_text

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".gif")
"""Suffixes opened as images (the content is checked too: Pillow must recognise the header)."""

MAX_FRAMES = 5000
"""Frames of a multi-page image read at most (a 2,000-page scan fits; a hostile TIFF whose frame
list loops or is endless stops here)."""


class ImageTooLargeError(FileNotReadableError):
    """A frame has more pixels than MAX_IMAGE_PIXELS (a decompression bomb, or a huge scan)."""


def is_image(path: Path) -> bool:
    """Whether `path` is to be opened as an image: by suffix."""
    return path.suffix.lower() in IMAGE_SUFFIXES


def frame_count(path: Path) -> int:
    """Frames of the image at `path`, each checked from its header alone.

    Raises ImageTooLargeError (a frame over MAX_IMAGE_PIXELS), FileNotReadableError (not an image
    Pillow knows, or damaged)."""
    from PIL import Image, UnidentifiedImageError

    name = display_name(path.name)
    try:
        with _sizes_unchecked(), Image.open(path) as image:  # header only: no pixel is decoded here
            frames = min(int(getattr(image, "n_frames", 1) or 1), MAX_FRAMES)
            for index in range(frames):
                if index:
                    image.seek(index)
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    where = f" (frame {index + 1})" if frames > 1 else ""
                    raise ImageTooLargeError(
                        f"{name} is {width:,} × {height:,} pixels{where}, over the "
                        f"{MAX_IMAGE_PIXELS // 1_000_000}-megapixel limit for images: scale it down and open it again")
            return frames
    except ImageTooLargeError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"{name} is too large to decode safely ({exc}): scale it down and open it again") from None
    except (UnidentifiedImageError, OSError, ValueError, EOFError, SyntaxError) as exc:
        raise FileNotReadableError(f"{name} cannot be read as an image ({os_reason(exc) if isinstance(exc, OSError) else exc}): "
                                   "open it in an image viewer and save it again") from None


_PIL_LIMIT = threading.Lock()


@contextmanager
def _sizes_unchecked():
    """Pillow's own bomb check off while only the header is read, so the refusal names the size;
    the OCR process decodes with the check on (`ocr_worker.MAX_IMAGE_PIXELS`)."""
    from PIL import Image

    with _PIL_LIMIT:
        limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = limit


def load_image(path: Path, *, progress: ProgressCallback | None = None,
               cancel: threading.Event | None = None) -> Document:
    """The image at `path` as a document of kind "pdf" (pages): one segment "page N" per frame
    with text, the text recognised by OCR (cached: a frame is recognised once).

    Raises ImageTooLargeError, FileNotReadableError (not an image, damaged, or OCR not installed),
    NoTextLayerError (no text found on any frame), or Cancelled."""
    from engine.documents.ocr import OcrFailed, OcrUnavailable, recognise_pages

    name = display_name(path.name)
    frames = frame_count(path)
    failed: dict[int, str] = {}
    try:
        pages = recognise_pages(path, "image", list(range(frames)), progress=progress, cancel=cancel, failed=failed)
    except OcrUnavailable as exc:
        raise FileNotReadableError(f"{name}: text in images cannot be read here, the OCR engine is not installed "
                                   f"({exc}): install rapidocr-onnxruntime 1.4 (Python 3.11 or 3.12)") from None
    except OcrFailed as exc:
        raise FileNotReadableError(f"{name} cannot be read as an image ({exc}): open it in an image viewer and "
                                   "save it again") from None
    segments, empty = [], []
    for index in range(frames):
        text = normalize_text(pages[index].text) if index in pages else ""
        if text:
            segments.append(Segment(text=text, label=f"page {index + 1}", page=index + 1, path=None))
        elif index not in failed:
            empty.append(index + 1)
    if not segments and failed:
        index, why = min(failed.items())
        raise FileNotReadableError(f"{name}: page {index + 1} cannot be read as an image ({why}): open it in an "
                                   "image viewer and save it again")
    if not segments:
        raise NoTextLayerError(f"{name}: no text was found in the image (OCR read nothing)")
    from engine.documents.document import page_ranges

    warnings = [f"{page_ranges([s.page for s in segments])}: recognised text (OCR) of an image: words may be misread"]
    if empty:
        warnings.append(f"{page_ranges(empty)}: no text found")
    warnings += [f"page {index + 1}: could not be read ({why}), skipped" for index, why in sorted(failed.items())]
    return Document(title=display_name(path.stem), source=str(path), kind="pdf", segments=segments,
                    warnings=warnings, pages=frames, recognised_pages=[s.page for s in segments])
