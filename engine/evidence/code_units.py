"""A code file cut into spans at its definitions, with the qualified names each span defines.

tree-sitter parses the file (grammars from `tree-sitter-language-pack`, chosen by the file's
extension); each top-level definition (function, class, method, type, module or class attribute)
starts a new piece at the start of its line, together with the comments and decorators right above
it; a container bigger than a span (a 1,500-line class) is cut at its members in turn. Pieces are
then packed in order into spans of at most `SPAN_MAX_CHARS` characters, so a span never begins in
the middle of a definition unless one definition alone is longer than a span (it is then cut at
blank lines, like prose). The names feed the full-text index's `defs` column: the file that defines
`HTTPAdapter` outranks the files that only use it. This is the unit aider's repository map and
code-search engines (Zoekt, Sourcegraph) rank by: definitions from a real parser, not a regex.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from engine.evidence.text_index import SPAN_MAX_CHARS, split_spans

# Extensions to tree-sitter-language-pack grammar names. A file of any other kind is prose to us.
LANGUAGES = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascript", ".ts": "typescript", ".mts": "typescript", ".tsx": "tsx", ".go": "go", ".rs": "rust",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".java": "java", ".kt": "kotlin", ".kts": "kotlin", ".rb": "ruby", ".php": "php", ".cs": "csharp",
    ".swift": "swift", ".scala": "scala", ".lua": "lua", ".sh": "bash", ".bash": "bash",
}
PARSE_MAX_BYTES = 2 * 1024 * 1024
"""Files bigger than this (generated tables, bundles) are cut like prose, not parsed."""
MAX_DEPTH = 4
"""How deep containers are opened (module → class → nested class → method): enough for real
code, and bounded so a pathologically nested file cannot recurse without end."""

# Node types that define something, across the grammars: python function_definition /
# class_definition, JS function_declaration / class_declaration / method_definition, Go
# function_declaration / method_declaration / type_declaration, Rust function_item / struct_item /
# impl_item / trait_item, Java / C# class_declaration / method_declaration, C function_definition …
_DEFINES = re.compile(
    r"(function|method|class|struct|enum|union|interface|trait|impl|module|namespace|type|object|record|"
    r"constructor|macro|protocol|extension|const|static|field|property|variable|lexical|assignment|preproc_def|"
    r"preproc_function_def)"
    r"(_definition|_declaration|_item|_specifier|_signature|_alias|_spec)?$")
# Containers whose members (methods, attributes, nested types) are definitions of their own.
_CONTAINS = re.compile(r"(class|struct|interface|trait|impl|module|namespace|object|record|protocol|extension|enum)"
                       r"(_definition|_declaration|_item|_specifier)?$")
# Wrappers around a definition: decorators, `export`, a statement holding an assignment.
_WRAPS = frozenset({"decorated_definition", "export_statement", "expression_statement", "template_declaration"})
_NAME_FIELDS = ("name", "left", "declarator", "type", "pattern")
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*")


@dataclass(frozen=True)
class CodeSpan:
    """One span of a code file: `text[start:end]` (characters) and the qualified names
    ("Session.request", "DEFAULT_TIMEOUT") of the definitions that begin in it."""

    start: int
    end: int
    names: tuple[str, ...]


def language_of(path: str | None) -> str | None:
    """The grammar name for a file at `path` ("python" for "src/app.py"), None when it has none."""
    return LANGUAGES.get(PurePosixPath(path).suffix.lower()) if path else None


@functools.cache
def _parser(language: str):
    from tree_sitter_language_pack import get_parser

    return get_parser(language)


def code_spans(path: str | None, text: str, max_chars: int = SPAN_MAX_CHARS) -> list[CodeSpan] | None:
    """`text` (a file at `path`) cut at its definitions into spans of at most `max_chars`
    characters covering it in order, with the names each defines; None when the file is not code
    tree-sitter knows (by extension), is bigger than PARSE_MAX_BYTES, or its grammar fails to load."""
    language = language_of(path)
    data = text.encode("utf-8", "surrogatepass")
    if language is None or len(data) > PARSE_MAX_BYTES:
        return None
    try:
        tree = _parser(language).parse(data)
    except (LookupError, OSError, RuntimeError, ValueError):
        return None
    pieces: list[tuple[int, list[str]]] = [(0, [])]  # (byte where a piece starts, names it defines)
    _collect(tree.root_node, data, "", max_chars, pieces, 0)
    chars = _byte_to_char(data, [start for start, _ in pieces])
    return _pack([(chars[start], names) for start, names in pieces], text, max_chars)


def indexed_names(span: CodeSpan) -> tuple[str, ...]:
    """The names the full-text index's `defs` column holds for `span`: each definition's own name
    ("handle_401", not "HTTPDigestAuth.handle_401", which would make every method's span a
    definition of its class)."""
    return tuple(dict.fromkeys(name.rsplit(".", 1)[-1] for name in span.names))


def segment_spans(path: str | None, text: str, max_chars: int = SPAN_MAX_CHARS) -> list[CodeSpan]:
    """The spans of one segment's `text`: a code file's (`code_spans`), else prose cut at blank
    lines and line ends (`split_spans`), naming nothing."""
    found = code_spans(path, text, max_chars)
    return found if found is not None else [CodeSpan(a, b, ()) for a, b in split_spans(text, max_chars)]


def _collect(container, data: bytes, prefix: str, max_chars: int, pieces: list, depth: int) -> None:
    """Append a piece for every definition among `container`'s children (and, for a container
    longer than `max_chars`, for its members), at the start of the definition's line or of the
    comments right above it."""
    children = container.children
    for k, child in enumerate(children):
        node = _unwrap(child)
        if not _DEFINES.search(node.type):
            continue
        name = _name(node, data)
        if name is None:
            continue
        qualified = f"{prefix}{name}"
        start = child.start_byte
        j = k
        while j > 0 and children[j - 1].type in ("comment", "line_comment", "block_comment", "decorator"):
            j -= 1
            start = children[j].start_byte
        start = data.rfind(b"\n", 0, start) + 1
        opened = depth < MAX_DEPTH and _CONTAINS.search(node.type) is not None
        cut = opened and child.end_byte - start > max_chars  # its members start pieces of their own
        names = [qualified] + (_members(node, data, qualified) if opened and not cut else [])
        if start > pieces[-1][0]:
            pieces.append((start, names))
        else:
            pieces[-1][1].extend(names)
        if cut:
            _collect(node.child_by_field_name("body") or node, data, f"{qualified}.", max_chars, pieces, depth + 1)


def _members(node, data: bytes, qualified: str) -> list[str]:
    """Qualified names of a container's direct members (methods, attributes)."""
    body = node.child_by_field_name("body")
    if body is None:
        return []
    names = []
    for child in body.children:
        member = _unwrap(child)
        if _DEFINES.search(member.type) and (name := _name(member, data)) is not None:
            names.append(f"{qualified}.{name}")
    return names


def _unwrap(node):
    """The definition inside a decorator, `export` or an expression statement (or `node`)."""
    for _ in range(3):
        if node.type not in _WRAPS:
            break
        inner = node.child_by_field_name("definition") or node.child_by_field_name("declaration")
        if inner is None:
            inner = next((c for c in node.named_children if c.type not in ("decorator", "comment")), None)
        if inner is None:
            break
        node = inner
    return node


def _name(node, data: bytes) -> str | None:
    """The identifier a definition node names: its `name` field, else the first identifier of its
    left side, declarator, type or first named child (`x = 1`, `int main(...)`, `impl Foo`,
    `const A = …`, `type T struct`)."""
    for _ in range(4):
        target = next((found for field in _NAME_FIELDS if (found := node.child_by_field_name(field)) is not None), None)
        if target is None:
            named = [c for c in node.named_children if c.type not in ("comment", "decorator", "modifiers")]
            target = named[0] if named else None
        if target is None:
            return None
        if node.type == "assignment" and target.type not in ("identifier", "name"):
            return None  # `os.environ["X"] = …`, `a, b = …` define no name of their own
        if target.end_byte - target.start_byte <= 200 and ("identifier" in target.type or target.type in (
                "name", "constant", "word")):
            match = _IDENTIFIER.search(data[target.start_byte:target.end_byte].decode("utf-8", "replace"))
            return match.group() if match else None
        node = target
    return None


def _byte_to_char(data: bytes, offsets: list[int]) -> dict[int, int]:
    """Character offsets of the byte offsets `offsets` of the UTF-8 `data` (each at a character
    boundary: line starts are)."""
    if len(data) == len(data.decode("utf-8", "surrogatepass")):
        return {offset: offset for offset in offsets}
    out, chars, last = {}, 0, 0
    for offset in sorted(set(offsets)):
        chars += len(data[last:offset].decode("utf-8", "surrogatepass"))
        out[offset], last = chars, offset
    return out


def _pack(pieces: list[tuple[int, list[str]]], text: str, max_chars: int) -> list[CodeSpan]:
    """Pieces (character start, names) packed in order into spans of at most `max_chars`; a piece
    longer than that is cut like prose (`split_spans`), its names going to its first part."""
    bounds = sorted({start for start, _ in pieces if 0 <= start < len(text)} | {0})
    names_at: dict[int, list[str]] = {}
    for start, names in pieces:
        names_at.setdefault(start, []).extend(names)
    spans: list[CodeSpan] = []
    start, names = 0, []
    for begin, end in zip(bounds, bounds[1:] + [len(text)]):
        if begin > start and end - start > max_chars:
            spans.append(CodeSpan(start, begin, tuple(dict.fromkeys(names))))
            start, names = begin, []
        names += names_at.get(begin, [])
        if end - start > max_chars:  # one piece longer than a span
            cuts = split_spans(text[start:end], max_chars)
            for k, (a, b) in enumerate(cuts[:-1]):
                spans.append(CodeSpan(start + a, start + b, tuple(dict.fromkeys(names)) if k == 0 else ()))
            start, names = start + cuts[-1][0], []
    spans.append(CodeSpan(start, len(text), tuple(dict.fromkeys(names))))
    return [span for span in spans if span.end > span.start] or [CodeSpan(0, len(text), ())]
