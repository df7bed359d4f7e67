"""`soagen fmt`: one canonical layout for .soa text, keeping every comment where it was.

Works on the token stream of the grammar's own lexer (comments and whitespace included), after the
parser has accepted the text, so it formats exactly what the parser reads. Each comment belongs to a
token: a comment on the same line after a token trails it, any other comment leads the next token.
The printer puts every statement on its own line and every comment back next to its token.

The style, not configurable:
- 4 spaces per level; `align` first in a layout; one statement per line, names grouped as written
  (`column float32 x, y, z`); one space after commas, none inside brackets: `float32[3, 3]`,
  `Nodes{x, y} as [n, c]`.
- Bindings of a model aligned in columns: direction, name, `= Layout{...}`, `as [...]`; then
  `indexes NAME`, `same n as NAME`, `whole` and `contiguous`, one space after the block or its
  axes.
- One blank line between declarations, and after the module docs and the imports; blank lines
  inside a body kept (at most one), never after a `{`, a `///` or before a `}`.
- Trailing comments two spaces after the code; a comment inside a statement breaks the line there
  and the statement goes on 8 spaces in.
- Numbers in canonical form (`+08` is `8`), `///x` becomes `/// x` (same doc text).

The result is checked before it is returned: it must parse to the same IR (spans aside) with the
same comments, so a formatter bug can never change what a schema means.

`schema_text` prints an IR (for `soagen show --ir`, with its symbolic layout as trailing comments)
by writing plain statements and formatting them here: all .soa text soagen writes has this one style.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from lark import Token
from lark.exceptions import LarkError

from soagen.dsl.diagnostics import Diagnostic, Span
from soagen.dsl.ir import Axis, Binding, Layout, Model, SchemaFile
from soagen.dsl.layout import (
    block_view,
    byte_size,
    linear_text,
    member_offsets,
    view_text,
)
from soagen.dsl.parser import MAX_DIGITS, _lark, keywords, parse

INDENT = "    "
CONTINUATION = INDENT * 2
_COMMENT_TYPES = frozenset({"COMMENT"})


class FormatBug(Exception):
    """The printed text would mean something else than the input: never written anywhere."""


@dataclass(frozen=True, slots=True)
class _Comment:
    text: str
    blank_before: bool


@dataclass(slots=True)
class _Tok:
    text: str
    type: str
    blank_before: bool  # a blank line between this token and the token or comment before it
    leading: list[_Comment] = field(default_factory=list)
    trailing: _Comment | None = None


def _tokens(text: str) -> tuple[list[_Tok], list[_Comment]]:
    """Significant tokens with their comments attached, and the comments after the last token."""
    tokens: list[_Tok] = []
    pending: list[_Comment] = []
    newlines = 0  # since the last token or comment
    last_was_token = False
    for raw in _lark().lex(text, dont_ignore=True):
        kind = raw.type
        value = str(raw)
        if kind == "WS":
            newlines += value.count("\n")
            continue
        if kind in _COMMENT_TYPES:
            body = value.rstrip()
            if newlines == 0 and last_was_token and tokens and tokens[-1].trailing is None:
                tokens[-1].trailing = _Comment(body, False)
            else:
                started = bool(tokens or pending)
                pending.append(_Comment(body, started and newlines >= 2))
            last_was_token = False
        else:
            started = bool(tokens or pending)
            tokens.append(_Tok(_canonical(raw), kind, started and newlines >= 2, pending))
            pending = []
            last_was_token = True
        newlines = 0
    return tokens, pending


def _canonical(token: Token) -> str:
    text = str(token)
    if token.type == "SIGNED_INT" and len(text.lstrip("+-").lstrip("0")) <= MAX_DIGITS:
        return str(int(text))
    if token.type in ("DOC_COMMENT", "MODULE_DOC"):
        marker, body = text[:3], text[3:].rstrip()
        # The doc text drops one leading space, so `///x` and `/// x` document the same.
        return f"{marker} {body}" if body and not body.startswith(" ") else marker + body
    return text


# --- structure ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Statement:
    """One line of code (maybe continued): its `///` docs and its tokens with canonical spacing."""

    kind: str  # moddoc, import, align, member, binding
    docs: list[_Tok]
    pieces: list[tuple[_Tok, str]]  # token and the space before it on the same line
    # Bindings: texts of direction, name and block, and the piece indexes padded to align them.
    columns: tuple[str, str, str] | None = None
    has_axes: bool = False


@dataclass(slots=True)
class _Declaration:
    kind: str  # layout or model
    docs: list[_Tok]
    header: list[tuple[_Tok, str]]
    body: list[_Statement]
    close: _Tok


class _Reader:
    """Recursive descent over tokens the parser has already accepted: only structure is decided here."""

    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.index = 0

    def peek(self) -> _Tok | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> _Tok:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def docs(self) -> list[_Tok]:
        docs = []
        while (token := self.peek()) is not None and token.type == "DOC_COMMENT":
            docs.append(self.take())
        return docs

    def items(self) -> Iterator[_Statement | _Declaration]:
        while (token := self.peek()) is not None:
            if token.type == "MODULE_DOC":
                yield _Statement("moddoc", [], [(self.take(), "")])
            elif token.text == "import":
                yield _Statement("import", [], [(self.take(), ""), (self.take(), " ")])
            else:
                yield self.declaration()

    def declaration(self) -> _Declaration:
        docs = self.docs()
        keyword = self.take()
        header = [(keyword, ""), (self.take(), " "), (self.take(), " ")]
        body: list[_Statement] = []
        while (token := self.peek()) is not None and token.text != "}":
            body.append(self.binding() if keyword.text == "model" else self.layout_item())
        if keyword.text == "layout":
            # `align` first; a stable sort keeps the order of everything else.
            body.sort(key=lambda statement: statement.kind != "align")
        return _Declaration(keyword.text, docs, header, body, self.take())

    def layout_item(self) -> _Statement:
        docs = self.docs()
        keyword = self.take()
        if keyword.text == "align":
            return _Statement("align", docs, [(keyword, ""), (self.take(), " ")])
        pieces = [(keyword, ""), (self.take(), " ")]
        if (token := self.peek()) is not None and token.text == "[":
            pieces += self.bracketed("]")
        pieces += self.name_list(" ")
        # No statement starts with `packed`: after the names it always closes this one.
        if (token := self.peek()) is not None and token.text == "packed":
            pieces.append((self.take(), " "))
        return _Statement("member", docs, pieces)

    def name_list(self, space: str) -> list[tuple[_Tok, str]]:
        pieces = [(self.take(), space)]
        while (token := self.peek()) is not None and token.text == ",":
            pieces += [(self.take(), ""), (self.take(), " ")]
        return pieces

    def bracketed(self, closing: str) -> list[tuple[_Tok, str]]:
        """`[` or `{`, a comma list, and the closing bracket, with no space inside."""
        pieces = [(self.take(), "")]
        pieces += self.name_list("")
        pieces.append((self.take(), ""))
        assert pieces[-1][0].text == closing
        return pieces

    def binding(self) -> _Statement:
        docs = self.docs()
        direction, name, equals, layout = self.take(), self.take(), self.take(), self.take()
        pieces = [(direction, ""), (name, " "), (equals, " "), (layout, " ")]
        pieces += self.bracketed("}")
        names = [token.text for token, _ in pieces[5:-1] if token.text != ","]
        block = f"{layout.text}{{{', '.join(names)}}}"
        has_axes = (token := self.peek()) is not None and token.text == "as"
        # The clauses after the block (`as [n, c] indexes NAME same n as NAME whole contiguous`),
        # whichever the grammar has: words one space apart, up to the next binding, its docs or `}`
        # (no clause word is `input` or `output`: the grammar keeps them out of its names).
        while (token := self.peek()) is not None and not (
            token.text == "}" or token.type == "DOC_COMMENT" or _starts_binding(token)
        ):
            if token.text == "[":
                list_pieces = self.bracketed("]")
                pieces += [(list_pieces[0][0], " "), *list_pieces[1:]]
            else:
                pieces.append((self.take(), " "))
        columns = (direction.text, name.text, block)
        return _Statement("binding", docs, pieces, columns, has_axes)


def _starts_binding(token: _Tok) -> bool:
    # The lexer alone reads `input` as a name; the grammar's keyword table knows it is a direction.
    return keywords().get(token.text) == "DIRECTION"


# --- printing -----------------------------------------------------------------------------------


def _is_simple(pieces: list[tuple[_Tok, str]]) -> bool:
    """No comment inside the statement: it prints on one line, so it can be padded into columns."""
    tokens = [token for token, _ in pieces]
    return not any(t.leading for t in tokens[1:]) and not any(t.trailing for t in tokens[:-1])


def _block_text(statement: _Statement) -> str:
    assert statement.columns is not None
    return statement.columns[2]


class _Printer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.previous: str | None = None  # kind of the last line at the current level

    def blank_if(self, wanted: bool) -> None:
        if wanted and self.lines and self.lines[-1] != "":
            self.lines.append("")

    def top_separator(self, kind: str, source_blank: bool) -> bool:
        previous = self.previous
        if previous is None or previous == "doc":
            return False
        if previous == "close":
            return True
        if kind in ("decl", "doc") and previous in ("moddoc", "import"):
            return True
        if kind != previous and {kind, previous} <= {"moddoc", "import"}:
            return True
        return source_blank

    def body_separator(self, kind: str, source_blank: bool) -> bool:
        if self.previous is None or self.previous == "doc":
            return False
        return source_blank

    def line(self, text: str, kind: str, source_blank: bool, top: bool) -> None:
        separator = self.top_separator if top else self.body_separator
        self.blank_if(separator(kind, source_blank))
        self.lines.append(text)
        self.previous = kind

    def comments(self, comments: list[_Comment], indent: str, top: bool) -> None:
        for comment in comments:
            self.line(indent + comment.text, "comment", comment.blank_before, top)

    def statement(
        self, pieces: list[tuple[_Tok, str]], docs: list[_Tok], indent: str, kind: str, top: bool
    ) -> None:
        for doc in docs:
            self.comments(doc.leading, indent, top)
            self.line(indent + doc.text, "doc", doc.blank_before, top)
        first = pieces[0][0]
        self.comments(first.leading, indent, top)
        rendered = _render(pieces, indent)
        self.line(rendered[0], kind, first.blank_before, top)
        self.lines += rendered[1:]

    def declaration(self, declaration: _Declaration) -> None:
        self.statement(declaration.header, declaration.docs, "", "decl", top=True)
        self.previous = None
        pieces_of = _aligned_bindings(declaration.body) if declaration.kind == "model" else {}
        for index, statement in enumerate(declaration.body):
            pieces = pieces_of.get(index, statement.pieces)
            self.statement(pieces, statement.docs, INDENT, "stmt", top=False)
        self.comments(declaration.close.leading, INDENT, top=False)
        close = "}" + (f"  {declaration.close.trailing.text}" if declaration.close.trailing else "")
        self.lines.append(close)
        self.previous = "close"


def _aligned_bindings(body: list[_Statement]) -> dict[int, list[tuple[_Tok, str]]]:
    """Pieces of one-line bindings padded so names, `=` and `as` line up down the model."""
    simple = {
        index: statement
        for index, statement in enumerate(body)
        if statement.columns is not None and _is_simple(statement.pieces)
    }
    if not simple:
        return {}
    direction_width = max(len(s.columns[0]) for s in simple.values() if s.columns)
    name_width = max(len(s.columns[1]) for s in simple.values() if s.columns)
    with_axes = [s for s in simple.values() if s.has_axes]
    block_width = max((len(_block_text(s)) for s in with_axes), default=0)
    padded: dict[int, list[tuple[_Tok, str]]] = {}
    for index, statement in simple.items():
        assert statement.columns is not None
        direction, name, block = statement.columns
        pieces = list(statement.pieces)
        pieces[1] = (pieces[1][0], " " * (direction_width - len(direction) + 1))
        pieces[2] = (pieces[2][0], " " * (name_width - len(name) + 1))
        if statement.has_axes:
            as_index = next(i for i, (t, _) in enumerate(pieces) if i > 3 and t.text == "as")
            pieces[as_index] = (pieces[as_index][0], " " * (block_width - len(block) + 1))
        padded[index] = pieces
    return padded


def _render(pieces: list[tuple[_Tok, str]], indent: str) -> list[str]:
    """A statement's lines: comments inside it break the line and the rest goes on indented."""
    continuation = indent + CONTINUATION
    lines: list[str] = []
    current = indent
    fresh = True  # nothing on the current line yet
    for index, (token, space) in enumerate(pieces):
        if index > 0 and token.leading:
            if not fresh:
                lines.append(current)
            lines += [continuation + comment.text for comment in token.leading]
            current, fresh = continuation, True
        current += ("" if fresh else space) + token.text
        fresh = False
        if token.trailing is not None:
            current += "  " + token.trailing.text
            if index < len(pieces) - 1:
                lines.append(current)
                current, fresh = continuation, True
    lines.append(current)
    return lines


def _print(tokens: list[_Tok], trailing: list[_Comment]) -> str:
    printer = _Printer()
    for item in _Reader(tokens).items():
        if isinstance(item, _Declaration):
            printer.declaration(item)
        else:
            printer.statement(item.pieces, item.docs, "", item.kind, top=True)
    printer.comments(trailing, "", top=True)
    return "\n".join(printer.lines) + "\n" if printer.lines else ""


# --- checking -----------------------------------------------------------------------------------


def without_spans(value: object) -> object:
    """IR with every `Span` left out: what a schema means, not where it was written. Fields left
    out of equality (what the checker resolved) are left out too."""
    if isinstance(value, Span):
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple(
                (item.name, without_spans(getattr(value, item.name)))
                for item in dataclasses.fields(value)
                if item.compare
            ),
        )
    if isinstance(value, tuple | list):
        return tuple(without_spans(item) for item in value)
    return value


def _comment_texts(text: str) -> list[str]:
    return sorted(
        str(t).rstrip() for t in _lark().lex(text, dont_ignore=True) if t.type == "COMMENT"
    )


def format_source(text: str, path: str) -> tuple[str | None, list[Diagnostic]]:
    """The canonical text of a schema, or None and its syntax errors. Raises `FormatBug` if the
    printed text would not mean the same (a bug in this module, never a problem of the schema)."""
    text = text.removeprefix("\ufeff")
    schema_file, problems = parse(text, path)
    if schema_file is None:
        return None, problems
    tokens, trailing = _tokens(text)
    formatted = _print(tokens, trailing)
    try:
        again, _ = parse(formatted, path)
        same_comments = _comment_texts(formatted) == _comment_texts(text)
    except LarkError as error:  # pragma: no cover - only a formatter bug gets here
        raise FormatBug(f"{path}: formatted text does not lex: {error}") from error
    if again is None or without_spans(again) != without_spans(schema_file) or not same_comments:
        raise FormatBug(f"{path}: formatting would change the schema; please report this")
    return formatted, []


# --- the IR as text -----------------------------------------------------------------------------


def with_defaults(schema_file: SchemaFile) -> SchemaFile:
    """A checked, resolved file with what it left to defaults written out: each layout's `align`
    and each binding's `as [...]` (placed at the layout's and the binding's name)."""

    def layout(item: Layout) -> Layout:
        if item.align_statements:
            return item
        return dataclasses.replace(item, align_statements=((item.align, item.span),))

    def binding(item: Binding) -> Binding:
        if item.axes is not None:
            return item
        axes = tuple(Axis(text, item.span) for text in item.axis_names)
        return dataclasses.replace(item, axes=axes, axes_span=item.span)

    def model(item: Model) -> Model:
        return dataclasses.replace(item, bindings=tuple(binding(b) for b in item.bindings))

    return dataclasses.replace(
        schema_file,
        layouts=tuple(layout(item) for item in schema_file.layouts),
        models=tuple(model(item) for item in schema_file.models),
    )


def _doc_lines(doc: str | None, marker: str = "///") -> list[str]:
    return [f"{marker} {line}" if line else marker for line in doc.split("\n")] if doc else []


def _layout_lines(layout: Layout, symbolic: bool) -> list[str]:
    offsets = member_offsets(layout) if symbolic else {}
    size = f"  // {linear_text(byte_size(layout))} bytes" if symbolic else ""
    lines = [*_doc_lines(layout.doc), f"layout {layout.name} {{{size}"]
    lines += [f"align {value}" for value, _ in layout.align_statements]
    for member in layout.members:
        at = f"  // at {linear_text(offsets[member.name])}" if symbolic else ""
        lines += _doc_lines(member.doc)
        lines.append(f"{member.statement_text}{at}")
    return [*lines, "}"]


def _binding_line(binding: Binding, symbolic: bool) -> str:
    members = ", ".join(binding.member_names)
    text = f"{binding.direction.value} {binding.name} = {binding.layout_name}{{{members}}}"
    if binding.axes is not None:
        text += f" as [{', '.join(axis.text for axis in binding.axes)}]"
    text += binding.trailing_clauses
    if symbolic:
        text += f"  // {view_text(block_view(binding))}"
    return text


def schema_text(schema_file: SchemaFile, *, symbolic: bool = False) -> str:
    """The IR as .soa text in fmt's one style: it parses back to the same IR, spans aside.

    With `symbolic` (a checked, resolved file), each layout, member and binding has a trailing
    comment with its symbolic size, offset or view: `soagen show --ir`.
    """
    lines = _doc_lines(schema_file.doc, "//!")
    lines += [f'import "{item.target}"' for item in schema_file.imports]
    for layout in schema_file.layouts:
        lines += _layout_lines(layout, symbolic)
    for model in schema_file.models:
        lines += [*_doc_lines(model.doc), f"model {model.name} {{"]
        for binding in model.bindings:
            lines += [*_doc_lines(binding.doc), _binding_line(binding, symbolic)]
        lines.append("}")
    formatted, problems = format_source("".join(line + "\n" for line in lines), schema_file.path)
    if formatted is None:  # pragma: no cover - only a bug of this printer gets here
        raise FormatBug(f"{schema_file.path}: the IR printed as text does not parse: {problems}")
    return formatted
