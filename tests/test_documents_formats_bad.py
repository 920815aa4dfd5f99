"""Bad office files get one clear line and lose nothing (issue 41, item 3): encrypted and legacy
Office files, zip bombs, XML external entities, external images and links (never fetched: a real
HTTP server on 127.0.0.1 counts the requests), truncated files. Before the format readers every
one of these was "not a text file (it contains binary data)"."""

from __future__ import annotations

import http.server
import struct
import threading
import time
import zipfile

import pytest

from engine.documents import load_document
from engine.documents.containers import (
    DamagedDocumentError, LegacyFormatError, ProtectedDocumentError, SuspiciousArchiveError,
)
from engine.errors import DocumentError
from tests.format_files import make_docx, make_epub, make_ods, make_odt, make_pptx, make_xlsx, write_zip

FREE, END, FAT_SECTOR, NONE = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF


def write_cfb(path, streams: list[str]):
    """An OLE compound file (MS-CFB v3: header, one FAT sector, one directory sector) holding the
    empty streams `streams` under its root, as Office lays out an encrypted file (MS-OFFCRYPTO
    2.3.4: EncryptionInfo, EncryptedPackage) or a binary .doc (WordDocument, 1Table)."""
    header = bytearray(512)
    header[0:8] = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
    struct.pack_into("<HHHHH", header, 24, 0x3E, 3, 0xFFFE, 9, 6)
    struct.pack_into("<IIIIIIIII", header, 40, 0, 1, 1, 0, 4096, END, 0, END, 0)
    struct.pack_into("<109I", header, 76, 0, *([FREE] * 108))
    fat = struct.pack("<128I", FAT_SECTOR, END, *([FREE] * 126))

    def entry(name, kind, right=NONE, child=NONE):
        raw = name.encode("utf-16-le") + b"\x00\x00"
        return (raw.ljust(64, b"\x00") + struct.pack("<HBBIII", len(raw), kind, 1, NONE, right, child)
                + bytes(16 + 4 + 16) + struct.pack("<IQ", END, 0))

    entries = [entry("Root Entry", 5, child=1)]
    for k, name in enumerate(streams, start=1):
        entries.append(entry(name, 2, right=k + 1 if k < len(streams) else NONE))
    directory = b"".join(entries).ljust(512, b"\x00")
    path.write_bytes(bytes(header) + fat + directory)
    return path


@pytest.mark.parametrize("name", ["salaries.xlsx", "contract.docx", "board.pptx"])
def test_an_encrypted_office_file_says_it_is_password_protected(tmp_path, name):
    path = write_cfb(tmp_path / name, ["EncryptionInfo", "EncryptedPackage"])
    with pytest.raises(ProtectedDocumentError) as error:
        load_document(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{name} is password-protected")
    assert "remove the password" in message


def test_a_binary_word_97_file_says_to_save_it_as_docx(tmp_path):
    path = write_cfb(tmp_path / "old memo.doc", ["WordDocument", "1Table"])
    with pytest.raises(LegacyFormatError, match=r"^old memo\.doc is a Word 97-2003 file.*save it as \.docx"):
        load_document(path)


def test_rtf_saved_under_a_doc_name_is_read(tmp_path):
    path = tmp_path / "letter.doc"
    path.write_bytes(b"{\\rtf1\\ansi Dear Ana,\\par see you soon.\\par}")
    assert load_document(path).segments[0].text == "Dear Ana,\nsee you soon."


def test_a_zip_with_too_many_entries_is_refused_before_any_library_opens_it(tmp_path):
    path = make_docx(tmp_path / "many.docx")
    with zipfile.ZipFile(path, "a") as archive:
        for n in range(10_001):
            archive.writestr(f"filler/item{n}.xml", b"")
    with pytest.raises(SuspiciousArchiveError, match=r"^many\.docx was not opened: its zip holds 10,0\d\d entries"):
        load_document(path)


def _declare_size(path, member: str, size: int):
    """Patch the central directory so that `member` declares `size` uncompressed bytes, as a zip bomb does."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + name_length].decode() == member:
            struct.pack_into("<I", data, at + 24, size)
            path.write_bytes(bytes(data))
            return path
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(member)


@pytest.mark.parametrize(("name", "make", "member", "message"), [
    ("bomb.docx", make_docx, "word/document.xml", "its part word/document.xml unpacks to 3,840 MiB (more than 256 MiB"),
    ("bomb.xlsx", make_xlsx, "xl/worksheets/sheet1.xml", "its zip unpacks to 3.8 GiB (more than 1 GiB"),
    ("bomb.pptx", make_pptx, "ppt/slides/slide1.xml", "its part ppt/slides/slide1.xml unpacks to 3,840 MiB"),
    ("bomb.epub", lambda p: make_epub(p, [("One", "<p>x</p>")]), "OEBPS/text/ch1.xhtml", "its part OEBPS/text/ch1.xhtml"),
    ("bomb.ods", lambda p: make_ods(p, "<table:table/>"), "content.xml", "its zip unpacks to 3.8 GiB"),
])
def test_a_zip_declaring_gigabytes_is_refused(tmp_path, name, make, member, message):
    path = _declare_size(make(tmp_path / name), member, 0xF000_0000)
    started = time.perf_counter()
    with pytest.raises(SuspiciousArchiveError) as error:
        load_document(path)
    assert str(error.value).startswith(f"{name} was not opened: {message}"), str(error.value)
    assert time.perf_counter() - started < 5


def test_one_part_too_large_to_parse_whole_is_refused(tmp_path):
    """300 MiB declared for document.xml: within the zip's 1 GiB, but lxml would need gigabytes for it."""
    path = _declare_size(make_docx(tmp_path / "big part.docx"), "word/document.xml", 300 << 20)
    with pytest.raises(SuspiciousArchiveError, match=r"^big part\.docx was not opened: its part word/document\.xml unpacks to 300 MiB"):
        load_document(path)


def test_a_member_that_truly_inflates_past_the_cap_is_refused(tmp_path, monkeypatch):
    from engine.documents import containers

    monkeypatch.setattr(containers, "MAX_UNCOMPRESSED_BYTES", 1 << 20)
    path = make_odt(tmp_path / "zeros.odt", "<text:p>hello</text:p>")
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("Pictures/zeros.bin", bytes(2 << 20))
    assert path.stat().st_size < 64 * 1024
    with pytest.raises(SuspiciousArchiveError):
        load_document(path)


class _Counter(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):  # noqa: N802 (the handler's name is http.server's)
        _Counter.requests.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"FETCHED-SECRET")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Counter.requests = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _rewrite(path, member, change):
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info.filename) for info in archive.infolist()}
    members[member] = change(members[member].decode("utf-8")).encode("utf-8")
    write_zip(path, None, members)


def test_xml_external_entities_are_never_resolved(tmp_path, server):
    secret = tmp_path / "secret.txt"
    secret.write_text("PASSWORD-HUNTER2")
    path = make_docx(tmp_path / "xxe.docx")
    doctype = (f'<!DOCTYPE w:document [<!ENTITY file SYSTEM "{secret.as_uri()}">'
               f'<!ENTITY web SYSTEM "{server}/xxe">]>')
    _rewrite(path, "word/document.xml", lambda t: t.replace("?>", "?>" + doctype, 1).replace(
        "The kestrel hovers", "&file;&web;The kestrel hovers", 1))
    text = load_document(path).render()
    assert "The kestrel hovers over the meadow." in text
    assert "PASSWORD-HUNTER2" not in text and "FETCHED-SECRET" not in text
    assert _Counter.requests == []


def test_external_images_and_links_are_never_fetched(tmp_path, server):
    docx_path = make_docx(tmp_path / "links.docx")
    _rewrite(docx_path, "word/_rels/document.xml.rels", lambda t: t.replace("</Relationships>", (
        f'<Relationship Id="rIdX1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image" '
        f'Target="{server}/logo.png" TargetMode="External"/>'
        f'<Relationship Id="rIdX2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink" '
        f'Target="{server}/page" TargetMode="External"/></Relationships>')))
    epub_path = make_epub(tmp_path / "links.epub", [("Remote", f'<p>Text here.</p><img src="{server}/pic.png"/>'
                                                                f'<iframe src="{server}/frame"></iframe>')],
                          extra_head=f'<link rel="stylesheet" href="{server}/style.css"/><script src="{server}/a.js"></script>')
    from pptx import Presentation

    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Linked"
    slide.shapes.title.text_frame.paragraphs[0].runs[0].hyperlink.address = f"{server}/slide-link"
    deck.save(tmp_path / "links.pptx")
    assert "The kestrel hovers" in load_document(docx_path).render()
    assert "Text here." in load_document(epub_path).render()
    assert "Linked" in load_document(tmp_path / "links.pptx").render()
    time.sleep(0.2)
    assert _Counter.requests == []


@pytest.mark.parametrize(("name", "make"), [
    ("report.docx", make_docx), ("deck.pptx", make_pptx), ("book.xlsx", make_xlsx),
    ("novel.epub", lambda p: make_epub(p, [("One", "<p>x</p>")])),
    ("notes.odt", lambda p: make_odt(p, "<text:p>hello</text:p>")),
])
def test_a_truncated_file_is_one_line_naming_it(tmp_path, name, make):
    path = make(tmp_path / name)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DamagedDocumentError) as error:
        load_document(path)
    message = str(error.value)
    assert message.startswith(f"{name} is damaged (") and "\n" not in message and "truncated" in message


def test_a_text_file_named_docx_is_damaged_not_a_traceback(tmp_path):
    path = tmp_path / "fake.docx"
    path.write_text("just some words")
    with pytest.raises(DamagedDocumentError, match=r"^fake\.docx is damaged \(it is not a zip archive"):
        load_document(path)


@pytest.mark.parametrize(("make", "holds"), [
    (lambda p: make_xlsx(p, rows=5), "it holds a spreadsheet: .xlsx"), (make_pptx, "it holds a presentation: .pptx"),
])
def test_a_spreadsheet_or_deck_named_docx_says_what_it_holds_not_that_it_is_empty(tmp_path, make, holds):
    path = (tmp_path / "renamed.docx")
    make(tmp_path / "real").rename(path)
    with pytest.raises(DamagedDocumentError) as error:
        load_document(path)
    assert str(error.value).startswith(f"renamed.docx is not a Word document ({holds}): ")


def test_a_zip_without_the_parts_of_its_format_is_damaged(tmp_path):
    path = write_zip(tmp_path / "hollow.docx", None, {"readme.txt": "hello"})
    with pytest.raises(DocumentError) as error:
        load_document(path)
    assert isinstance(error.value, DamagedDocumentError) and str(error.value).startswith("hollow.docx is damaged (")


@pytest.mark.parametrize(("name", "make"), [
    ("fuzz.docx", make_docx), ("fuzz.pptx", make_pptx), ("fuzz.xlsx", lambda p: make_xlsx(p, rows=20)),
    ("fuzz.epub", lambda p: make_epub(p, [("One", "<p>x</p>")])),
    ("fuzz.odt", lambda p: make_odt(p, "<text:h>Title</text:h><text:p>hello</text:p>")),
])
def test_damaged_xml_inside_a_valid_zip_is_one_line_never_a_traceback(tmp_path, name, make):
    """Each XML part cut short or given a foreign root in turn: the file reads, or fails with a
    DocumentError naming it."""
    path = make(tmp_path / name)
    with zipfile.ZipFile(path) as archive:
        original = {info.filename: archive.read(info.filename) for info in archive.infolist()}
    xml_parts = [m for m in original if m.endswith((".xml", ".rels", ".xhtml", ".opf", ".ncx"))]
    for member in xml_parts:
        for damage in (original[member][: len(original[member]) // 2], b'<?xml version="1.0"?><x:junk xmlns:x="urn:x"/>'):
            write_zip(path, None, {**original, member: damage})
            try:
                load_document(path)
            except DocumentError as error:
                assert str(error).startswith(name) and "\n" not in str(error), (member, str(error))


@pytest.mark.parametrize(("uri", "protected"), [("OEBPS/text/ch1.xhtml", True), ("OEBPS/fonts/serif.otf", False)])
def test_a_drm_book_is_refused_and_an_obfuscated_font_is_not_drm(tmp_path, uri, protected):
    path = make_epub(tmp_path / "book.epub", [("One", "<p>The kestrel flew.</p>")])
    encryption = ('<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
                  'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
                  f'<enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData></enc:EncryptedData></encryption>')
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("META-INF/encryption.xml", encryption)
    if protected:
        with pytest.raises(ProtectedDocumentError, match=r"^book\.epub is protected by DRM"):
            load_document(path)
    else:
        assert "The kestrel flew." in load_document(path).render()
