"""Text to IR: the Lark grammar in `grammar.lark`, and a walk of its tree that builds `SchemaFile`.

Syntax errors come back as diagnostics (code SOA001) saying what was found and what was expected.
"""

from __future__ import annotations

import functools
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from soagen.diagnostics import Diagnostic, Span
from soagen.dsl.ir import (
    Axis,
    Binding,
    Direction,
    Import,
    Layout,
    Member,
    MemberKind,
    Model,
    SchemaFile,
)

# How the grammar's terminals read in an error message.
TERMINAL_WORDS: dict[str, str] = {
    "NAME": "a name",
    "STRING": 'a quoted path ("other.soa")',
    "SIGNED_INT": "a number",
    "DIRECTION": "`input` or `output`",
    "LBRACE": "`{`",
    "RBRACE": "`}`",
    "LSQB": "`[`",
    "RSQB": "`]`",
    "COMMA": "`,`",
    "EQUAL": "`=`",
    "DOC_COMMENT": "a `///` doc comment",
    "MODULE_DOC": "a `//!` doc comment",
    "IMPORT": "`import`",
    "LAYOUT": "`layout`",
    "MODEL": "`model`",
    "ALIGN": "`align`",
    "COLUMN": "`column`",
    "SCALAR": "`scalar`",
    "AS": "`as`",
    "$END": "the end of the file",
}


@functools.cache
def _lark() -> Lark:
    grammar = resources.files("soagen.dsl").joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def _expected_words(expected: set[str]) -> str:
    words = sorted({TERMINAL_WORDS.get(name, name) for name in expected if name not in _SILENT})
    if not words:
        return ""
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


# Doc comments may stand almost anywhere; listing them in every "expected" would drown the message.
_SILENT = {"DOC_COMMENT", "MODULE_DOC"}


def _token_text(token: Token) -> str:
    if token.type == "$END":
        return "the end of the file"
    return f"`{token}`"


def _syntax_diagnostic(error: UnexpectedInput, path: str, text: str) -> Diagnostic:
    line = error.line if error.line > 0 else max(1, text.count("\n") + 1)
    column = error.column if error.column > 0 else 1
    if isinstance(error, UnexpectedCharacters):
        char = text[error.pos_in_stream] if error.pos_in_stream < len(text) else ""
        message = f"unexpected character `{char}`"
        hint = None
        if char == '"':
            hint = "a quoted path must close on the same line"
        elif not char.isascii():
            hint = "names use letters, digits and `_`"
        span = Span(path, line, column, line, column + 1)
        return Diagnostic("SOA001", message, span, hint)
    if isinstance(error, UnexpectedToken):
        token = error.token
        expected = _expected_words(set(error.expected))
        message = f"unexpected {_token_text(token)}"
        if token.type == "$END":
            message = "unexpected end of file"
        if expected:
            message += f", expected {expected}"
        if token.type == "$END":
            lines = text.splitlines() or [""]
            line, column = len(lines), len(lines[-1]) + 1
            span = Span(path, line, column, line, column + 1)
        else:
            end_column = token.end_column if token.end_column else column + len(str(token))
            span = Span(path, line, column, token.end_line or line, end_column)
        hint = _syntax_hint(token, set(error.expected))
        return Diagnostic("SOA001", message, span, hint)
    if isinstance(error, UnexpectedEOF):
        lines = text.splitlines() or [""]
        expected = _expected_words(set(error.expected))
        span = Span(path, len(lines), len(lines[-1]) + 1, len(lines), len(lines[-1]) + 2)
        message = "unexpected end of file" + (f", expected {expected}" if expected else "")
        return Diagnostic("SOA001", message, span)
    span = Span(path, line, column, line, column + 1)
    return Diagnostic("SOA001", str(error).strip().splitlines()[0], span)


_KEYWORDS = {"import", "layout", "model", "align", "column", "scalar", "as", "input", "output"}


def _syntax_hint(token: Token, expected: set[str]) -> str | None:
    if "NAME" in expected and str(token) in _KEYWORDS:
        return f"`{token}` is a keyword of the .soa language; choose another name"
    if token.type == "$END" and "RBRACE" in expected:
        return "a `{` is not closed"
    return None


class _Builder:
    """Walks one parse tree into a `SchemaFile`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def span(self, item: Token | Tree[Token]) -> Span:
        if isinstance(item, Token):
            return Span(
                self.path,
                item.line or 1,
                item.column or 1,
                item.end_line or item.line or 1,
                item.end_column or (item.column or 1) + len(item),
            )
        meta = item.meta
        return Span(self.path, meta.line, meta.column, meta.end_line, meta.end_column)

    @staticmethod
    def doc(comments: list[Tree[Token]]) -> str | None:
        if not comments:
            return None
        lines = []
        for comment in comments:
            token = comment.children[0]
            assert isinstance(token, Token)
            body = str(token)[3:]
            lines.append(body[1:] if body.startswith(" ") else body)
        return "\n".join(lines).strip("\n") or None

    @staticmethod
    def split(children: list[Token | Tree[Token]]) -> tuple[list[Tree[Token]], list[Token | Tree[Token]]]:
        docs = [c for c in children if isinstance(c, Tree) and c.data == "doc_comment"]
        rest = [c for c in children if not (isinstance(c, Tree) and c.data == "doc_comment")]
        return docs, rest

    def build(self, tree: Tree[Token]) -> SchemaFile:
        module_docs: list[str] = []
        imports: list[Import] = []
        layouts: list[Layout] = []
        models: list[Model] = []
        for child in tree.children:
            assert isinstance(child, Tree)
            if child.data == "module_doc":
                token = child.children[0]
                assert isinstance(token, Token)
                body = str(token)[3:]
                module_docs.append(body[1:] if body.startswith(" ") else body)
            elif child.data == "import_stmt":
                token = child.children[0]
                assert isinstance(token, Token)
                imports.append(Import(str(token)[1:-1], self.span(token)))
            elif child.data == "layout":
                layouts.append(self.layout(child))
            elif child.data == "model":
                models.append(self.model(child))
        module_doc = "\n".join(module_docs).strip("\n") or None
        return SchemaFile(self.path, module_doc, tuple(imports), tuple(layouts), tuple(models))

    def layout(self, tree: Tree[Token]) -> Layout:
        docs, rest = self.split(tree.children)
        name = rest[0]
        assert isinstance(name, Token)
        align_statements: list[tuple[int, Span]] = []
        members: list[Member] = []
        for item in rest[1:]:
            assert isinstance(item, Tree)
            item_docs, parts = self.split(item.children)
            if item.data == "align_stmt":
                value = parts[0]
                assert isinstance(value, Token)
                align_statements.append((int(str(value)), self.span(value)))
                continue
            kind = MemberKind.COLUMN if item.data == "column_stmt" else MemberKind.SCALAR
            dtype_tree, names = parts
            assert isinstance(dtype_tree, Tree) and isinstance(names, Tree)
            dtype_token = dtype_tree.children[0]
            assert isinstance(dtype_token, Token)
            shape: tuple[int, ...] = ()
            if len(dtype_tree.children) > 1:
                shape_tree = dtype_tree.children[1]
                assert isinstance(shape_tree, Tree)
                shape = tuple(int(str(extent)) for extent in shape_tree.children)
            doc = self.doc(item_docs)
            for name_token in names.children:
                assert isinstance(name_token, Token)
                members.append(
                    Member(
                        str(name_token),
                        kind,
                        str(dtype_token),
                        shape,
                        doc,
                        self.span(name_token),
                        self.span(dtype_tree),
                    )
                )
        return Layout(
            str(name),
            tuple(align_statements),
            tuple(members),
            self.doc(docs),
            self.span(name),
            self.path,
        )

    def model(self, tree: Tree[Token]) -> Model:
        docs, rest = self.split(tree.children)
        name = rest[0]
        assert isinstance(name, Token)
        bindings: list[Binding] = []
        for item in rest[1:]:
            assert isinstance(item, Tree)
            bindings.append(self.binding(item))
        return Model(str(name), tuple(bindings), self.doc(docs), self.span(name), self.path)

    def binding(self, tree: Tree[Token]) -> Binding:
        docs, parts = self.split(tree.children)
        direction, name, layout_name, names = parts[:4]
        assert isinstance(direction, Token) and isinstance(name, Token)
        assert isinstance(layout_name, Token) and isinstance(names, Tree)
        axes: tuple[Axis, ...] | None = None
        axes_span: Span | None = None
        if len(parts) > 4:
            axes_tree = parts[4]
            assert isinstance(axes_tree, Tree)
            axes_span = self.span(axes_tree)
            axes = tuple(self.axis(axis) for axis in axes_tree.children if isinstance(axis, Tree))
        member_tokens = [t for t in names.children if isinstance(t, Token)]
        return Binding(
            Direction(str(direction)),
            str(name),
            str(layout_name),
            tuple(str(t) for t in member_tokens),
            axes,
            self.doc(docs),
            self.span(name),
            self.span(layout_name),
            tuple(self.span(t) for t in member_tokens),
            axes_span,
        )

    def axis(self, tree: Tree[Token]) -> Axis:
        token = tree.children[0]
        assert isinstance(token, Token)
        return Axis(str(token), self.span(token))


def parse(text: str, path: str) -> tuple[SchemaFile | None, list[Diagnostic]]:
    """Parse one file. Returns the IR, or None and the syntax error."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as error:
        return None, [_syntax_diagnostic(error, path, text)]
    return _Builder(path).build(tree), []
