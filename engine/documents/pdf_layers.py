"""Optional content (layers) that a PDF's default view switches off, marked so that its text is
left out (B24 in docs/REAL_WORLD_INPUTS.md).

A PDF can put content in optional-content groups ("layers", ISO 32000-1 8.11) and switch some of
them off: viewers do not draw them, text extractors return their text spliced into the page
(pdf.js #15370: a planted instruction in a layer nobody sees). PDFium draws only what is on, but
neither its text page nor its API says which group a page object belongs to. So pypdf reads the
document's configuration and decides what is off the way PDFium's renderer does (CPDF_OCContext:
the default configuration's BaseState, ON and OFF; a group's Intent and /Usage /View /ViewState;
membership dictionaries with /P or a /VE expression), and marks it in an in-memory copy that
PDFium then reads:

- a group or membership dictionary that is off gets the entry /HalamanHidden 1, a parameter of
  PDFium's "OC" content mark on every page object of its marked content;
- a form XObject whose own /OC is off has its content wrapped in `/HalamanHidden BMC ... EMC`;
- an annotation whose /OC is off gets the Hidden flag: flattening leaves it out.

The copy is the file's bytes plus an incremental update of the changed objects; an encrypted
file is rewritten whole, unencrypted, in memory only, and one that pypdf cannot parse (a broken
cross-reference table) is read from the copy PDFium saves of what it repaired. `hidden_text_objects` gives a page's text
objects that are so marked, also through the form objects that hold them. Runs in the PDF worker.
"""

from __future__ import annotations

import ctypes
import io
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

MARK = "HalamanHidden"
"""Name of the content mark, and of the dictionary entry, that say "in a layer that is off"."""

HIDDEN_REASON = "in a hidden layer"
"""Why text of a layer the default view switches off is left out (the page's warning says it)."""

UNCHECKED_REASON = "in a layer that could not be checked"
"""Why text of any layer is left out where the layers could not be checked."""

LAYERS_BUDGET_S = 10.0
"""Longest time spent finding the layers that are off before giving up with a warning (the
worker's whole page limit is 30 s; a layered map of a few thousand objects takes well under 1 s)."""

_VE_DEPTH = 32  # PDFium's limit for nested /VE expressions; deeper ones count as off, as there
_STARTXREF = re.compile(rb"startxref\s+(\d+)")


class LayersUnchecked(Exception):
    """The layers could not be checked (pypdf could not read the file, or it took too long)."""


@dataclass
class MarkedLayers:
    """The marked copy of a PDF (`data`: what PDFium opens instead of the file) and, per 0-based
    page index, how many annotations in layers that are off were left out."""

    data: bytes
    hidden_annotations: dict[int, int] = field(default_factory=dict)


def mark_hidden_layers(path: str, password: str | None, document: Any = None,
                       budget_s: float | None = None) -> MarkedLayers | None:
    """The PDF at `path` with what its default view switches off marked (see the module), or
    None when nothing is off. `document`: the same file opened by PDFium (a pypdfium2
    `PdfDocument`); where pypdf cannot parse the file, the copy PDFium saves of what it repaired
    is read instead. `budget_s` in seconds (default LAYERS_BUDGET_S). Raises LayersUnchecked."""
    started = time.monotonic()
    budget_s = LAYERS_BUDGET_S if budget_s is None else budget_s
    try:
        # From the open file, not its bytes: pypdf reads only what it needs (the catalog here).
        with open(path, "rb") as handle:
            return _mark(handle, password, started, budget_s)
    except LayersUnchecked:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser failure: try PDFium's repaired copy
        failure = exc
    # A file pypdf cannot parse (P07 has no cross-reference table) is mostly old and
    # uncompressed: without a single "/OC" in its bytes it has no layers to worry about.
    if not _mentions_optional_content(path):
        return None
    if document is not None:
        import pypdfium2.raw as pdfium_raw

        try:
            copy = io.BytesIO()
            document.save(copy, flags=pdfium_raw.FPDF_REMOVE_SECURITY)
            copy.seek(0)
            return _mark(copy, None, started, budget_s)
        except LayersUnchecked:
            raise
        except Exception as exc:  # noqa: BLE001
            failure = exc
    raise LayersUnchecked(f"pypdf could not read them: {type(failure).__name__}") from None


def _mark(handle: Any, password: str | None, started: float, budget_s: float) -> MarkedLayers | None:
    import pypdf

    reader = pypdf.PdfReader(handle, strict=False)
    if reader.is_encrypted and not reader.decrypt(password or ""):
        raise LayersUnchecked("pypdf could not decrypt it")
    if _dict(reader.trailer["/Root"].get_object().get("/OCProperties")) is None:
        return None
    if reader.is_encrypted:  # updates would have to be encrypted: write a plain copy instead
        writer = pypdf.PdfWriter(clone_from=reader)
        root, pages = writer.root_object, writer.pages
    else:
        writer, root, pages = None, reader.trailer["/Root"].get_object(), reader.pages
    marker = _Marker(_dict(root.get("/OCProperties")), started, budget_s)
    for index, page in enumerate(pages):
        marker.page(index, page)
    if not marker.changed:
        return None
    if writer is not None:
        copy = io.BytesIO()
        writer.write(copy)
        return MarkedLayers(copy.getvalue(), marker.annotations)
    handle.seek(0)
    return MarkedLayers(_increment(handle.read(), reader, marker.changed), marker.annotations)


def _mentions_optional_content(path: str, chunk: int = 1 << 20) -> bool:
    """Whether the file's bytes hold "/OC" anywhere (also True when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            tail = b""
            while block := handle.read(chunk):
                if b"/OC" in tail + block:
                    return True
                tail = block[-2:]
    except OSError:
        return True
    return False


class _Marker:
    """Decides what is off and marks it, page by page; `changed`: the indirect objects written."""

    def __init__(self, properties: Any, started: float, budget_s: float) -> None:
        config = _dict(properties.get("/D")) or {}
        self._groups = {_key(ref) for ref in _array(properties.get("/OCGs"))}
        self._on = {_key(ref) for ref in _array(config.get("/ON"))}
        self._off = {_key(ref) for ref in _array(config.get("/OFF"))}
        self._base_on = _get(config, "/BaseState") != "/OFF"
        self._auto = [usage for usage in (_dict(u) for u in _array(config.get("/AS")))
                      if usage is not None and _get(usage, "/Event", "/View") == "/View"]
        self._visible: dict[Any, bool] = {}
        self._seen: set[Any] = set()
        self._deadline = started + budget_s
        self.changed: dict[Any, Any] = {}
        self.annotations: dict[int, int] = {}
        for ref in _array(properties.get("/OCGs")):
            group = _dict(ref)
            if group is not None and not self.visible(group):
                self._mark(group, ref)  # groups are indirect objects (ISO 32000-1 8.11.2.1)

    def page(self, index: int, page: Any) -> None:
        self._check_time()
        self._resources(page.get("/Resources"), page.indirect_reference)
        annotations = page.get("/Annots")
        in_array = annotations if _is_reference(annotations) else page.indirect_reference
        for ref in _array(annotations):
            annotation = _dict(ref)
            if annotation is None:
                continue
            group = _dict(annotation.get("/OC"))
            if group is not None and not self.visible(group):
                from pypdf.generic import NameObject, NumberObject

                holder = ref if _is_reference(ref) else in_array
                flags = _get(annotation, "/F", 0)
                annotation[NameObject("/F")] = NumberObject((flags if isinstance(flags, int) else 0) | 2)  # Hidden
                self.changed[_key(holder)] = holder
                self.annotations[index] = self.annotations.get(index, 0) + 1
            appearances = _dict(annotation.get("/AP"))
            normal = appearances.get("/N") if appearances is not None else None
            # One appearance stream, or a dictionary of them by state (a check box's /On, /Off).
            one = _is_stream(normal.get_object() if normal is not None else None)
            for stream in [normal] if one else list((_dict(normal) or {}).values()):
                self._form(stream)

    def visible(self, group: Any, level: int = 0) -> bool:
        """Whether PDFium draws content of an optional-content group or membership dictionary."""
        if _get(group, "/Type", "/OCG") != "/OCMD":
            key = _key(group)
            if key not in self._visible:
                self._visible[key] = self._group_on(group)
            return self._visible[key]
        expression = _get(group, "/VE")
        if isinstance(expression, list):
            return self._expression(expression, level)
        members = group.get("/OCGs")
        members = [members] if _dict(members) is not None else _array(members)
        states = [self.visible(member) for member in (_dict(m) for m in members) if member is not None]
        if not states:
            return True
        policy = _get(group, "/P", "/AnyOn")
        return {"/AllOn": all(states), "/AnyOff": not all(states), "/AllOff": not any(states)}.get(policy, any(states))

    def _group_on(self, group: Any) -> bool:
        intent = _get(group, "/Intent", "/View")
        if not {"/View", "/All"} & {str(i) for i in (intent if isinstance(intent, list) else [intent])}:
            return True  # a group for another intent (design, print) does not affect the view
        usage = _dict(group.get("/Usage")) or {}
        state = _get(_dict(usage.get("/View")) or {}, "/ViewState")
        if state is not None:
            return state != "/OFF"
        key = _key(group)
        if key not in self._groups:
            return True
        on = key in self._on or (self._base_on and key not in self._off)
        for usage in self._auto:
            if key in {_key(ref) for ref in _array(usage.get("/OCGs"))}:
                for category in _array(usage.get("/Category")):
                    found = _get(_dict((_dict(group.get("/Usage")) or {}).get(str(category))) or {}, "/ViewState")
                    if found is not None:
                        on = found != "/OFF"
        return on

    def _expression(self, expression: list[Any], level: int) -> bool:
        if level > _VE_DEPTH or not expression:
            return False
        operator, operands = str(expression[0]), [o.get_object() for o in expression[1:] if o is not None]
        values = [self.visible(o) if _dict(o) is not None else self._expression(o, level + 1)
                  for o in operands if _dict(o) is not None or isinstance(o, list)]
        if operator == "/Not":
            return bool(values) and not values[0]
        if operator == "/Or":
            return any(values)
        if operator == "/And":
            return bool(values) and all(values)
        return False

    def _resources(self, resources: Any, holder: Any) -> None:
        resources, holder = _dict(resources), resources if _is_reference(resources) else holder
        if resources is None or not self._first_visit(resources):
            return
        properties = resources.get("/Properties")
        properties_holder = properties if _is_reference(properties) else holder
        for value in (_dict(properties) or {}).values():
            group = _dict(value)
            if group is not None and _get(group, "/Type") == "/OCMD" and not self.visible(group):
                self._mark(group, value if _is_reference(value) else properties_holder)
        for value in (_dict(resources.get("/XObject")) or {}).values():
            self._form(value)

    def _form(self, ref: Any) -> None:
        stream = ref.get_object() if ref is not None else None
        if not _is_stream(stream) or _get(stream, "/Subtype") != "/Form" or not _is_reference(ref):
            return
        if not self._first_visit(stream):
            return
        self._check_time()
        group = _dict(stream.get("/OC"))
        if group is not None and not self.visible(group):
            _wrap(stream)
            self.changed[_key(ref)] = ref
        self._resources(stream.get("/Resources"), ref)

    def _mark(self, group: Any, holder: Any) -> None:
        """Mark `group`, which `holder` (a reference: the group or the object it lies in) writes."""
        from pypdf.generic import NameObject, NumberObject

        if _is_reference(holder):
            group[NameObject("/" + MARK)] = NumberObject(1)
            self.changed[_key(holder)] = holder

    def _first_visit(self, obj: Any) -> bool:
        key = _key(obj)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _check_time(self) -> None:
        if time.monotonic() > self._deadline:
            raise LayersUnchecked("it took too long")


def _wrap(stream: Any) -> None:
    """Put a form XObject's content inside the hidden mark, Flate-compressed whatever its filters."""
    from pypdf.generic import NameObject, StreamObject

    data = zlib.compress(b"/" + MARK.encode() + b" BMC\n" + stream.get_data() + b"\nEMC")
    if "/DecodeParms" in stream:
        del stream[NameObject("/DecodeParms")]
    stream[NameObject("/Filter")] = NameObject("/FlateDecode")
    StreamObject.set_data(stream, data)  # the encoded bytes as they are, for any stream class


def _increment(original: bytes, reader: Any, changed: dict[Any, Any]) -> bytes:
    """`original` followed by an incremental update (ISO 32000-1 7.5.6) holding the `changed`
    objects and a cross-reference stream, as pypdf's own incremental writer makes it."""
    out = bytearray(original if original.endswith(b"\n") else original + b"\n")
    entries = []
    for ref in sorted(changed.values(), key=lambda r: (r.idnum, r.generation)):
        body = io.BytesIO()
        ref.get_object().write_to_stream(body)
        entries.append((ref.idnum, len(out), ref.generation))
        out += b"%d %d obj\n" % (ref.idnum, ref.generation) + body.getvalue() + b"\nendobj\n"
    size = int(reader.trailer.get("/Size", 0))
    xref_number = max([size] + [number + 1 for number, _, _ in entries])
    entries.append((xref_number, len(out), 0))
    rows = b"".join(b"\x01" + offset.to_bytes(8, "big") + generation.to_bytes(2, "big")
                    for _, offset, generation in entries)
    index = b" ".join(b"%d 1" % number for number, _, _ in entries)
    trailer = b"/Root %d %d R" % (reader.trailer.raw_get("/Root").idnum, reader.trailer.raw_get("/Root").generation)
    info = reader.trailer.raw_get("/Info") if "/Info" in reader.trailer else None
    if info is not None and hasattr(info, "idnum"):
        trailer += b" /Info %d %d R" % (info.idnum, info.generation)
    found = _STARTXREF.findall(original[-2048:])
    if found:
        trailer += b" /Prev " + found[-1]
    xref_at = len(out)
    out += (b"%d 0 obj\n<< /Type /XRef /Size %d /W [1 8 2] /Index [%s] %s /Length %d >>\nstream\n"
            % (xref_number, xref_number + 1, index, trailer, len(rows)) + rows + b"\nendstream\nendobj\n")
    out += b"startxref\n%d\n%%%%EOF\n" % xref_at
    return bytes(out)


def hidden_text_objects(page: Any, raw: Any, every_layer: bool = False) -> set[int]:
    """Addresses of the text objects of `page` (a pypdfium2 `PdfPage` of a marked copy) that are
    in a layer that is off: marked themselves or inside a marked form object. `every_layer`:
    those in any optional-content marked content, on or off (where nothing could be marked)."""
    found: set[int] = set()
    stack = [(raw.FPDFPage_GetObject(page.raw, i), False) for i in range(raw.FPDFPage_CountObjects(page.raw))]
    while stack:
        obj, hidden = stack.pop()
        if not obj:
            continue
        hidden = hidden or _marked(obj, raw, every_layer)
        kind = raw.FPDFPageObj_GetType(obj)
        if kind == raw.FPDF_PAGEOBJ_TEXT and hidden:
            found.add(ctypes.cast(obj, ctypes.c_void_p).value or 0)
        elif kind == raw.FPDF_PAGEOBJ_FORM:
            stack += [(raw.FPDFFormObj_GetObject(obj, i), hidden) for i in range(raw.FPDFFormObj_CountObjects(obj))]
    return found


def _marked(obj: Any, raw: Any, every_layer: bool) -> bool:
    value = ctypes.c_int()
    name = (ctypes.c_ushort * (len(MARK) + 1))()
    length = ctypes.c_ulong()
    for index in range(raw.FPDFPageObj_CountMarks(obj)):
        mark = raw.FPDFPageObj_GetMark(obj, index)
        if raw.FPDFPageObjMark_GetParamIntValue(mark, MARK.encode(), ctypes.byref(value)) and value.value == 1:
            return True
        if raw.FPDFPageObjMark_GetName(mark, name, ctypes.sizeof(name), ctypes.byref(length)):
            tag = bytes(name)[:max(0, min(length.value, ctypes.sizeof(name)) - 2)].decode("utf-16-le", "replace")
            if tag == MARK or (every_layer and tag == "OC"):
                return True
    return False


def _is_reference(obj: Any) -> bool:
    return obj is not None and type(obj).__name__ == "IndirectObject"


def _is_stream(obj: Any) -> bool:
    return obj is not None and hasattr(obj, "get_data")


def _dict(obj: Any) -> Any:
    obj = obj.get_object() if obj is not None else None
    return obj if isinstance(obj, dict) else None


def _get(dictionary: Any, key: str, default: Any = None) -> Any:
    """`dictionary[key]` resolved (pypdf's `get` leaves references as they are), or `default`."""
    value = dictionary.get(key)
    return default if value is None else value.get_object()


def _array(obj: Any) -> list[Any]:
    obj = obj.get_object() if obj is not None else None
    return list(obj) if isinstance(obj, list) else []


def _key(obj: Any) -> Any:
    """Identity of a PDF object: its object number where it has one (references and what they
    resolve to alike), else the Python object."""
    if _is_reference(obj):
        return obj.idnum, obj.generation
    reference = getattr(obj, "indirect_reference", None)
    return (reference.idnum, reference.generation) if reference is not None else ("direct", id(obj))
