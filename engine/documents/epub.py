"""E-books (.epub 2 and 3): the spine's documents in reading order, chapters from the navigation
document, each document's text through the HTML reader (`html.html_text`).

The zip is read directly (after `containers.open_archive`'s checks), its XML with
`containers.SAFE_XML_PARSER`: META-INF/container.xml names the package document (OPF); its
manifest and spine give the reading order (EPUB 3.3 §5.4, §5.6); the table of contents comes from
the EPUB 3 navigation document (the manifest item with property "nav", its `nav epub:type="toc"`)
or else the EPUB 2 NCX (the spine's `toc`). Each spine document is a unit labelled with the title
of the first table-of-contents entry that points into it ("Chapter 3. The Storm"), else
"part N"; every entry is an outline entry at its nesting level. Left out: images, audio, video,
scripts (never run: html_text drops them), styles, fonts, and anything outside the file (remote
resources are never fetched). An encrypted (DRM) book is refused with a one-line error.
"""

from __future__ import annotations

import posixpath
import threading
from pathlib import Path
from urllib.parse import unquote

from engine.documents.document import Document, ProgressCallback
from engine.documents.containers import DamagedDocumentError, ProtectedDocumentError, open_archive, parse_xml, read_member
from engine.documents.encoding import UnclearEncodingError, decode_bytes
from engine.documents.html import html_text
from engine.documents.parts import Part, build_document, check_cancel, short_title

_CONTAINER = "{urn:oasis:names:tc:opendocument:xmlns:container}"
_OPF = "{http://www.idpf.org/2007/opf}"
_NCX = "{http://www.daisy.org/z3986/2005/ncx/}"
_XHTML = "{http://www.w3.org/1999/xhtml}"
_EPUB = "{http://www.idpf.org/2007/ops}"
_HTML_TYPES = ("application/xhtml+xml", "text/html", "application/x-dtbook+xml")


def load_epub(path: Path, name: str, *, progress: ProgressCallback | None = None,
              cancel: threading.Event | None = None) -> Document:
    """The e-book at `path` (shown as `name`): one unit per spine document, chapters as outline
    entries. Raises the `containers` errors, ProtectedDocumentError (DRM), EmptyFileError, Cancelled."""
    with open_archive(path, name) as archive:
        members = set(archive.namelist())
        if "META-INF/encryption.xml" in members and _encrypts_content(archive, name):
            raise ProtectedDocumentError(f"{name} is protected by DRM (its chapters are encrypted): "
                                         "Halaman cannot read it; open a DRM-free copy")
        container = parse_xml(read_member(archive, "META-INF/container.xml", name), "META-INF/container.xml", name)
        rootfile = container.find(f".//{_CONTAINER}rootfile")
        if rootfile is None or not rootfile.get("full-path"):
            raise DamagedDocumentError(f"{name} is damaged (META-INF/container.xml names no package document): "
                                       "open it in an e-book editor and save it again")
        opf_path = rootfile.get("full-path")
        opf = parse_xml(read_member(archive, opf_path, name), opf_path, name)
        base = posixpath.dirname(opf_path)
        manifest = {item.get("id"): item for item in opf.iter(_OPF + "item")}
        spine = [manifest[ref.get("idref")] for ref in opf.iter(_OPF + "itemref") if ref.get("idref") in manifest]
        hrefs = [_join(base, item.get("href") or "") for item in spine]
        toc = _table_of_contents(archive, opf, manifest, base, members, name)
        parts: list[Part] = []
        for number, (item, href) in enumerate(zip(spine, hrefs, strict=True), start=1):
            check_cancel(cancel)
            if progress:
                progress(number - 1, len(spine))
            if item.get("media-type") not in _HTML_TYPES or href not in members:
                continue
            entries = [(title, level) for title, level, target in toc if target == href]
            text = html_text(_decoded(read_member(archive, href, name)))
            label = short_title(entries[0][0]) if entries else f"part {number}"
            parts.append(Part(label, text, entries))
    return build_document(path, name, "epub", parts, progress=progress)


def _decoded(data: bytes) -> str:
    try:
        return decode_bytes(data).text
    except UnclearEncodingError:  # EPUB's XHTML is UTF-8 or UTF-16 (EPUB 3.3 §6.1.4)
        return data.decode("utf-8", "replace")


def _join(base: str, href: str) -> str:
    """A manifest or link `href` (percent-encoded, maybe with a #fragment) as a zip member name."""
    return posixpath.normpath(posixpath.join(base, unquote(href.split("#", 1)[0]))).lstrip("/")


def _encrypts_content(archive, name: str) -> bool:
    """Whether META-INF/encryption.xml encrypts more than fonts (font obfuscation is not DRM)."""
    root = parse_xml(read_member(archive, "META-INF/encryption.xml", name), "META-INF/encryption.xml", name)
    uris = [ref.get("URI") or "" for ref in root.iter("{http://www.w3.org/2001/04/xmlenc#}CipherReference")]
    return any(not uri.lower().endswith((".ttf", ".otf", ".woff", ".woff2")) for uri in uris)


def _table_of_contents(archive, opf, manifest, base: str, members: set[str], name: str) -> list[tuple[str, int, str]]:
    """(title, level, zip member) of each table-of-contents entry, in order: the EPUB 3 nav
    document's toc, else the NCX; [] when the book has neither."""
    nav = next((item for item in manifest.values() if "nav" in (item.get("properties") or "").split()), None)
    if nav is not None:
        href = _join(base, nav.get("href") or "")
        if href in members:
            entries = _nav_entries(parse_xml(read_member(archive, href, name), href, name), posixpath.dirname(href))
            if entries:
                return entries
    spine = opf.find(_OPF + "spine")
    ncx = manifest.get(spine.get("toc")) if spine is not None else None
    if ncx is None:
        ncx = next((item for item in manifest.values() if item.get("media-type") == "application/x-dtbncx+xml"), None)
    if ncx is None:
        return []
    href = _join(base, ncx.get("href") or "")
    if href not in members:
        return []
    root = parse_xml(read_member(archive, href, name), href, name)
    found: list[tuple[str, int, str]] = []
    _ncx_points(root.find(f"{_NCX}navMap"), 0, posixpath.dirname(href), found)
    return found


def _nav_entries(root, base: str) -> list[tuple[str, int, str]]:
    navs = list(root.iter(_XHTML + "nav"))
    toc = next((n for n in navs if "toc" in (n.get(_EPUB + "type") or "").split()), navs[0] if navs else None)
    found: list[tuple[str, int, str]] = []
    if toc is None:
        return found
    for anchor in toc.iter(_XHTML + "a"):
        level = sum(1 for a in anchor.iterancestors(_XHTML + "ol")) - 1
        title = " ".join("".join(anchor.itertext()).split())
        if title and anchor.get("href"):
            found.append((title, max(level, 0), _join(base, anchor.get("href"))))
    return found


def _ncx_points(parent, level: int, base: str, found: list[tuple[str, int, str]]) -> None:
    if parent is None or level > 16:
        return
    for point in parent.findall(_NCX + "navPoint"):
        title = " ".join("".join(point.find(f"{_NCX}navLabel").itertext()).split()) if point.find(f"{_NCX}navLabel") is not None else ""
        content = point.find(_NCX + "content")
        if title and content is not None and content.get("src"):
            found.append((title, level, _join(base, content.get("src"))))
        _ncx_points(point, level + 1, base, found)
