"""HTML files and saved web pages as the text a browser shows (B17 in docs/REAL_WORLD_INPUTS.md).

A saved page is mostly not text: B17's 154 kB page holds 266 characters of it, beside inline
scripts, 1,000 style rules and a 146 kB base64 image; given to the model raw it cost 122k tokens.
The text is laid out by inscriptis (chosen by measurement against trafilatura and selectolax:
docs/REAL_WORLD_INPUTS.md): headings and paragraphs as paragraphs, tables as aligned columns,
lists with bullets. Left out, as a browser with scripts on does not show them: <script>, <style>,
<noscript>, <template>, elements with the `hidden` attribute or an inline `display: none`, images
(data URIs included) and link targets. Nothing is fetched: no script runs, and lxml's parser
never loads a URL (external DTDs, stylesheets, images).
"""

from __future__ import annotations

import re

from inscriptis import Inscriptis
from inscriptis.css_profiles import CSS_PROFILES
from inscriptis.model.config import ParserConfig
from lxml import etree
from lxml import html as lxml_html

HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
"""File names read as web pages (`html_text`), alone or inside a folder."""

# "strict": inline elements are not padded with spaces a browser would not show ("<em>ops</em>").
_CONFIG = ParserConfig(css=CSS_PROFILES["strict"], display_images=False, display_links=False)
_NOT_SHOWN = "//script | //style | //noscript | //template | //*[@hidden]"
# lxml refuses a str that still carries an XML encoding declaration (XHTML); the text is decoded.
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")


def html_text(source: str) -> str:
    """The text a browser shows for the HTML document `source` (decoded), its <title> first.

    Returns "" for a page without text. Never raises for malformed HTML (lxml repairs it as
    browsers do).
    """
    source = _XML_DECLARATION.sub("", source, count=1)
    if not source.strip():
        return ""
    try:
        tree = lxml_html.document_fromstring(source)
    except (etree.ParserError, ValueError):  # "Document is empty": only comments or a doctype
        return ""
    title = " ".join((tree.findtext(".//title") or "").split())
    for element in tree.xpath(_NOT_SHOWN):
        element.drop_tree()  # keeps the text after the element, which belongs to its parent
    text = Inscriptis(tree, _CONFIG).get_text().strip()
    if title and not text.startswith(title):
        text = f"{title}\n\n{text}" if text else title
    return text
