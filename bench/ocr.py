"""OCR accuracy and speed: pages of real PDFs that have a text layer, rendered to images at 150 and
300 dpi, recognised by Halaman's OCR pipeline (`engine.documents.ocr_worker`: the same scaling and
engine settings as the app, 2 threads), compared with the page's text layer.

    python bench/ocr.py                       # docs/bench/ocr.json and ocr_pages.csv
    python bench/ocr.py --pages 4             # a quick look
    python bench/ocr.py --memory 12           # the OCR process's RSS over a 12-page scan (TIFF)
    python bench/ocr.py --speed 12            # 12 pages at 300 dpi timed (wall and CPU): run it alone

Character error rate (CER) = Levenshtein distance (insertions, deletions, substitutions; a
bit-parallel exact computation, Hyyrö 2003) between the recognised text and the text layer, both
with white space collapsed to single spaces and normalised as the model sees them
(`normalize_text`), divided by the text layer's length. Reading-order differences (a running
header the text layer puts last) count as errors too, so the figure is an upper bound of the
misread characters. Speed: pages per minute of recognition alone (render excluded), on
`OCR_THREADS` threads; the machine's load average is recorded with it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine.documents.ocr import (  # noqa: E402
    ENGINE_VERSION, OCR_THREADS, OcrLine, RecognisedPage, page_from_event, reading_order,
)

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = str(OCR_THREADS)

from engine.documents.ocr_worker import load_engine, page_event  # noqa: E402
from engine.documents.text import normalize_text  # noqa: E402

SOURCES = [  # (corpus path, pages wanted): a book's prose and code, a legal summary, SEC filings
    ("pdf/P16_thinkpython2.pdf", 6),
    ("pdf/P05_dmca.pdf", 3),
    ("financebench-dev/pdfs/3M_2022_10K.pdf", 3),
    ("financebench-dev/pdfs/NETFLIX_2017_10K.pdf", 3),
    ("financebench-dev/pdfs/NIKE_2023_10K.pdf", 3),
    ("financebench-dev/pdfs/BOEING_2022_10K.pdf", 2),
]
DPIS = (150, 300)


def levenshtein(a: str, b: str) -> int:
    """Edit distance of `a` and `b` (unit costs), Hyyrö's bit-vector form of Myers' algorithm:
    one pass over `b` with `len(a)`-bit integers."""
    if not a:
        return len(b)
    full, top = (1 << len(a)) - 1, 1 << (len(a) - 1)
    peq: dict[str, int] = {}
    for i, char in enumerate(a):
        peq[char] = peq.get(char, 0) | (1 << i)
    pv, mv, score = full, 0, len(a)
    for char in b:
        eq = peq.get(char, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & top:
            score += 1
        elif mh & top:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


def flat(text: str) -> str:
    return " ".join(normalize_text(text).split())


def clean_pages(document, wanted: int) -> list[int]:
    """`wanted` 0-based pages spread over the document whose text layer is running text: 1,200 to
    5,000 characters, under 8 % digits (not a table of figures), mostly letters, and at least 60 %
    of its characters in lines of 50 or more (a table whose cells wrap has short lines, and its
    text layer reads cell by cell where OCR reads row by row: reading order, not misreading)."""
    candidates = []
    for index in range(len(document)):
        raw = document[index].get_textpage().get_text_range()
        text = flat(raw)
        digits = sum(c.isdigit() for c in text)
        letters = sum(c.isalpha() for c in text)
        long_lines = sum(len(line.strip()) for line in raw.splitlines() if len(line.strip()) >= 50)
        if (1200 <= len(text) <= 5000 and digits < 0.08 * len(text) and letters > 0.7 * len(text)
                and long_lines >= 0.6 * len(text)):
            candidates.append(index)
    if len(candidates) <= wanted:
        return candidates
    step = len(candidates) / wanted
    return [candidates[int(step * (i + 0.5))] for i in range(wanted)]


def rows_reference(page) -> str:
    """The page's text layer put in OCR's reading order: PDFium's lines (its text split at line
    breaks, each with the box of its characters) ordered by `engine.documents.ocr.reading_order`.
    A running footer the text layer stores first then comes last, as on the page."""
    textpage = page.get_textpage()
    text = textpage.get_text_range()
    if len(text) != textpage.count_chars():  # characters beyond U+FFFF: no index match
        return text
    lines, start = [], 0
    for end in [i for i, char in enumerate(text) if char == "\n"] + [len(text)]:
        boxes = [textpage.get_charbox(i) for i in range(start, end) if not text[i].isspace()]
        if boxes:
            box = (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))
            lines.append(OcrLine(text=" ".join(text[start:end].split()), box=box, score=1.0))
        start = end + 1
    return RecognisedPage(lines=reading_order(lines), width=0, height=0).text


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def measure(corpus: Path, per_source: int | None) -> dict:
    import pypdfium2 as pdfium

    recognise = load_engine(OCR_THREADS)
    rows, started_load = [], loadavg()
    for relative, wanted in SOURCES:
        document = pdfium.PdfDocument(str(corpus / relative))
        for index in clean_pages(document, per_source or wanted):
            page = document[index]
            reference = flat(page.get_textpage().get_text_range())
            in_rows = flat(rows_reference(page))
            width, height = page.get_size()
            for dpi in DPIS:
                image = page.render(scale=dpi / 72).to_pil().convert("RGB")
                started = time.perf_counter()
                event = page_event(index, image, width, height, lambda x, y, s=dpi / 72: (x / s, height - y / s), recognise)
                seconds = time.perf_counter() - started
                text = flat(page_from_event(event).text)
                errors = levenshtein(text, reference)
                # Without white space: PP-OCR's English model drops some spaces between words.
                bare_reference = reference.replace(" ", "")
                bare_errors = levenshtein(text.replace(" ", ""), bare_reference)
                row_errors = levenshtein(text, in_rows)
                rows.append({"file": Path(relative).name, "page": index + 1, "dpi": dpi, "chars": len(reference),
                             "errors": errors, "cer": round(errors / len(reference), 4),
                             "cer_no_spaces": round(bare_errors / len(bare_reference), 4),
                             "bare_chars": len(bare_reference), "bare_errors": bare_errors,
                             "cer_rows": round(row_errors / len(in_rows), 4), "row_chars": len(in_rows),
                             "row_errors": row_errors,
                             "seconds": round(seconds, 2)})
                print(f"{rows[-1]['file']:32} p{index + 1:<4} {dpi} dpi  CER {rows[-1]['cer']:.2%} (rows {rows[-1]['cer_rows']:.2%}, no spaces {rows[-1]['cer_no_spaces']:.2%})  {seconds:.1f} s", flush=True)
        document.close()
    summary = {}
    for dpi in DPIS:
        mine = [r for r in rows if r["dpi"] == dpi]
        total_seconds = sum(r["seconds"] for r in mine)
        summary[str(dpi)] = {
            "pages": len(mine), "cer": round(sum(r["errors"] for r in mine) / sum(r["chars"] for r in mine), 4),
            "cer_rows": round(sum(r["row_errors"] for r in mine) / sum(r["row_chars"] for r in mine), 4),
            "cer_no_spaces": round(sum(r["bare_errors"] for r in mine) / sum(r["bare_chars"] for r in mine), 4),
            "median_page_cer": sorted(r["cer"] for r in mine)[len(mine) // 2],
            "worst_page_cer": max(r["cer"] for r in mine),
            "pages_per_minute": round(60 * len(mine) / total_seconds, 2)}
    return {"engine": ENGINE_VERSION, "threads": OCR_THREADS, "loadavg_before": started_load,
            "loadavg_after": loadavg(), "cpus": os.cpu_count(), "summary": summary, "pages": rows}


def speed(corpus: Path, count: int) -> dict:
    """Recognition time of `count` 300-dpi pages (render excluded), taken in turn from each source's
    clean pages: wall seconds and CPU seconds (this process's user + system time, all of ONNX
    Runtime's and OpenCV's threads) per page, with the load average before and after. On a quiet
    machine wall time is the pages per minute a user sees; under load, CPU seconds per page is the
    fair figure (two cores give at most 120 CPU seconds a minute)."""
    import pypdfium2 as pdfium

    recognise = load_engine(OCR_THREADS)
    queue = []
    for relative, wanted in SOURCES:
        document = pdfium.PdfDocument(str(corpus / relative))
        queue.append([(Path(relative).name, document, index) for index in clean_pages(document, wanted)])
    picked = [pages[turn] for turn in range(max(map(len, queue))) for pages in queue if turn < len(pages)][:count]
    rows, before = [], loadavg()
    for name, document, index in picked:
        page = document[index]
        width, height = page.get_size()
        image = page.render(scale=300 / 72).to_pil().convert("RGB")
        cpu, wall = time.process_time(), time.perf_counter()
        event = page_event(index, image, width, height, lambda x, y: (x, y), recognise)
        rows.append({"file": name, "page": index + 1,
                     "lines": len(event["lines"]), "wall_s": round(time.perf_counter() - wall, 2),
                     "cpu_s": round(time.process_time() - cpu, 2), "loadavg": loadavg()})
        print(rows[-1], flush=True)
    wall_s, cpu_s = sum(r["wall_s"] for r in rows), sum(r["cpu_s"] for r in rows)
    return {"engine": ENGINE_VERSION, "threads": OCR_THREADS, "cpus": os.cpu_count(), "dpi": 300,
            "pages": len(rows), "pages_per_minute": round(60 * len(rows) / wall_s, 2),
            "cpu_s_per_page": round(cpu_s / len(rows), 2), "loadavg_before": before, "loadavg_after": loadavg(),
            "per_page": rows}


def memory(frames: int, out: Path) -> dict:
    """RSS of the OCR process after each page of a `frames`-page TIFF of rendered P16-like text
    (Pillow's font), read through `engine.documents.ocr.recognise_pages` with a fresh cache."""
    import tempfile

    import psutil
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=30)
    pages = []
    for number in range(frames):
        image = Image.new("L", (1275, 1650), 255)
        draw = ImageDraw.Draw(image)
        for line in range(24):
            draw.text((100, 120 + 56 * line), f"Page {number + 1}, line {line + 1}: the quick brown fox jumps over "
                      "the lazy dog.", fill=0, font=font)
        pages.append(image)
    samples: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        os.environ["HALAMAN_HOME"] = folder
        path = Path(folder) / "binder.tiff"
        pages[0].save(path, save_all=True, append_images=pages[1:], compression="tiff_deflate")
        del pages

        def progress(done: int, total: int) -> None:
            workers = psutil.Process().children()
            rss = sum(w.memory_info().rss for w in workers if w.is_running())
            samples.append({"pages_done": done, "worker_rss_mib": round(rss / 2**20, 1),
                            "seconds": round(time.perf_counter() - started, 1)})
            print(samples[-1], flush=True)

        from engine.documents.ocr import recognise_pages

        before, started = loadavg(), time.perf_counter()
        recognise_pages(path, "image", list(range(frames)), progress=progress)
    first = next(sample for sample in samples if sample["pages_done"] == 1)
    per_minute = 60 * (frames - 1) / (samples[-1]["seconds"] - first["seconds"])
    return {"frames": frames, "lines_per_page": 24, "samples": samples, "pages_per_minute_after_the_first": round(per_minute, 2),
            "loadavg_before": before, "loadavg_after": loadavg()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path(os.environ.get("HALAMAN_CORPUS", REPO / "corpus")))
    parser.add_argument("--pages", type=int, default=None, help="pages per source (default: as listed)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    parser.add_argument("--memory", type=int, default=0, help="measure the OCR process's RSS over a scan of N pages")
    parser.add_argument("--speed", type=int, default=0, help="time N pages at 300 dpi (wall and CPU), nothing else")
    args = parser.parse_args()
    if args.speed:
        result = speed(args.corpus, args.speed)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ocr_speed.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print({key: value for key, value in result.items() if key != "per_page"})
        return 0
    if args.memory:
        result = memory(args.memory, args.out)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ocr_memory.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        return 0
    result = measure(args.corpus, args.pages)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ocr.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    with (args.out / "ocr_pages.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(result["pages"][0]))
        writer.writeheader()
        writer.writerows(result["pages"])
    print(json.dumps(result["summary"], indent=1), "load:", result["loadavg_before"], "->", result["loadavg_after"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
