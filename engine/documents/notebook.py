"""Jupyter notebooks (.ipynb) as the text a reader sees: cells, not their JSON.

A notebook is JSON (nbformat 4: https://nbformat.readthedocs.io/en/latest/format_description.html);
read raw, one embedded image makes it a single 35k-character line that the repository loader
skips as minified, and base64 would fill the model's context anyway. Each cell becomes text:
markdown as written, code in a fenced block after "In [n]:", outputs after "Out [n]:" with
their text trimmed to MAX_OUTPUT_CHARS and images replaced by a one-line placeholder.
"""

from __future__ import annotations

import json

NOTEBOOK_SUFFIX = ".ipynb"

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
"""Notebooks may be this large (images make them big; they are dropped), not plain.MAX_FILE_BYTES."""

MAX_OUTPUT_CHARS = 2000
"""Text kept of one output (a log or a printed table); the rest is counted, not shown."""

# What a display output's text is taken from, best first; anything else (images, HTML widgets,
# JavaScript) gets a placeholder naming its type.
_TEXT_TYPES = ("text/markdown", "text/plain", "text/latex")


class NotebookError(ValueError):
    """The file is not a notebook this reader understands (not JSON, no cell list)."""


def notebook_text(raw: str) -> str:
    """The readable text of a notebook given as its JSON text. Raises NotebookError."""
    try:
        notebook = json.loads(raw)
    except ValueError as error:
        raise NotebookError(f"not valid JSON ({error.msg} at line {error.lineno})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise NotebookError("no list of cells (nbformat 4 is needed)")
    language = _language(notebook)
    parts = [part for cell in cells if isinstance(cell, dict) for part in _cell(cell, language)]
    return "\n\n".join(parts)


def _language(notebook: dict) -> str:
    metadata = notebook.get("metadata") or {}
    for value in ((metadata.get("language_info") or {}).get("name"), (metadata.get("kernelspec") or {}).get("language")):
        if isinstance(value, str) and value.isidentifier():
            return value
    return "python"


def _source(value: object) -> str:
    """nbformat stores multi-line strings as a string or a list of lines."""
    if isinstance(value, list):
        return "".join(item for item in value if isinstance(item, str))
    return value if isinstance(value, str) else ""


def _cell(cell: dict, language: str) -> list[str]:
    source = _source(cell.get("source")).strip("\n")
    kind = cell.get("cell_type")
    if kind != "code":
        return [source] if source.strip() else []  # markdown and raw cells as written
    count = cell.get("execution_count")
    label = f"[{count}]" if isinstance(count, int) else "[ ]"
    parts = [f"In {label}:\n```{language}\n{source}\n```"] if source.strip() else []
    outputs = [text for output in cell.get("outputs") or [] if isinstance(output, dict)
               for text in [_output(output)] if text]
    if outputs:
        parts.append(f"Out {label}:\n" + "\n".join(outputs))
    return parts


def _output(output: dict) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return _trim(_source(output.get("text")))
    if kind == "error":
        return f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
    data = output.get("data")
    if not isinstance(data, dict):
        return ""
    shown = [f"[{mime} output omitted]" for mime in data if not mime.startswith("text/")]
    text = next((_source(data[mime]) for mime in _TEXT_TYPES if mime in data), "")
    return "\n".join([*shown, _trim(text)] if text.strip() else shown)


def _trim(text: str) -> str:
    text = text.strip("\n")
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[:MAX_OUTPUT_CHARS] + f"\n[... {len(text) - MAX_OUTPUT_CHARS:,} more characters of output]"
