"""XFA forms (Adobe LiveCycle): the field values a dynamic form keeps in its XML, not on its pages.

A dynamic XFA form's pages hold only what a viewer without XFA shows ("Please wait... If this
message is not eventually replaced by the proper contents of the document, your PDF viewer may not
be able to display this type of document."); what was typed into it lives in the `datasets` packet
of the XML in the catalog's /AcroForm /XFA entry (XFA 3.3 specification, "The datasets element";
ISO 32000-1 §12.7.8). `xfa_values` reads that packet as "Applicant.Name: Ada Lovelace" lines.

The XML is the document's, so untrusted: a packet with a DOCTYPE (where entities are declared: a
"billion laughs" or an external entity) is not parsed at all, and the values are capped in number
and length. It runs in the bounded PDF worker (`engine.documents.pdf_worker`), like every parser of
a PDF's bytes, and only for a file PDFium calls an XFA form (`FPDF_GetFormType`).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from typing import Any

MAX_PACKET_BYTES = 16 << 20
MAX_VALUES = 5000
MAX_VALUE_CHARS = 2000
_DTD = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.I)


def xfa_values(path: str, password: str | None) -> dict | None:
    """The XFA form of the PDF at `path`: None when it has none; else {"values": ["Name: Ada", …]}
    (its filled-in fields in document order, dotted paths below the form's root) or {"error":
    why they could not be read}. Never raises."""
    try:
        import pypdf

        reader = pypdf.PdfReader(path, strict=False)
        if reader.is_encrypted and not reader.decrypt(password or ""):
            return None
        form = reader.trailer["/Root"].get_object().get("/AcroForm")
        xfa = form.get_object().get("/XFA") if form is not None else None
        if xfa is None:
            return None
        packet = _datasets(xfa.get_object())
    except Exception as exc:  # noqa: BLE001 - a broken form must not cost the page text
        return {"error": f"its XML could not be read ({type(exc).__name__})"}
    if packet is None:
        return {"error": "it holds no data packet"}
    if len(packet) > MAX_PACKET_BYTES:
        return {"error": f"its data packet is over {MAX_PACKET_BYTES >> 20} MB"}
    if _DTD.search(packet):
        return {"error": "its data declares entities (a DOCTYPE), which are never expanded"}
    try:
        root = ElementTree.fromstring(packet)
    except ElementTree.ParseError as exc:
        return {"error": f"its data is not well-formed XML ({exc})"}
    data = next((e for e in root.iter() if _local(e.tag) == "data"), root)
    return {"values": _leaf_values(data)}


def _datasets(xfa: Any) -> bytes | None:
    """The datasets packet's bytes: from the [name, stream, …] array, or found inside a single
    stream holding the whole XDP document."""
    if isinstance(xfa, list):
        for k in range(0, len(xfa) - 1, 2):
            if str(xfa[k]) == "datasets":
                return xfa[k + 1].get_object().get_data()
        return None
    whole = xfa.get_data()
    match = re.search(rb"<(\w+:)?datasets\b.*?</(\w+:)?datasets\s*>", whole, re.S)
    return match.group(0) if match else None


def _leaf_values(data: ElementTree.Element) -> list[str]:
    """"path: value" for each element with text and no children, below `data`'s form root."""
    values: list[str] = []

    def walk(element: ElementTree.Element, path: list[str]) -> None:
        for child in element:
            if len(values) >= MAX_VALUES:
                return
            name = [*path, _local(child.tag)]
            if len(child):
                walk(child, name)
            elif child.text and child.text.strip():
                text = " ".join(child.text.split())[:MAX_VALUE_CHARS]
                values.append(f"{'.'.join(name[1:] or name)}: {text}")

    walk(data, [])
    return values


def _local(tag: Any) -> str:
    return str(tag).rsplit("}", 1)[-1]


PLACEHOLDER_NOTE = ("an XFA form (LiveCycle): its filled-in values were read from the form's data and added "
                    "after page {page}'s text; the pages show only what the form prints before it runs")
UNREAD_NOTE = ("an XFA form (LiveCycle) whose values could not be read: {why}; its pages hold only the text "
               "shown before the form runs (\u201cPlease wait\u2026\u201d): open it in Adobe Acrobat Reader "
               "and print it to a PDF to read what was filled in")


def form_text(xfa: dict | None) -> tuple[str, str | None]:
    """(Text to add after the first page's: "Form data (XFA):" and its value lines, or ""; the
    warning that says what was done, or None without an XFA form) for `xfa_values`' result."""
    if not xfa:
        return "", None
    values = xfa.get("values")
    if values:
        return "Form data (XFA):\n" + "\n".join(values), PLACEHOLDER_NOTE
    return "", UNREAD_NOTE.format(why=xfa.get("error") or "it holds no filled-in values")
