"""Text to IR: the Lark grammar in `grammar.lark`, and a walk of its tree that builds `SchemaFile`.

Syntax errors come back as diagnostics (code SOA001) saying what was found and what was expected.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from soagen.dsl.diagnostics import Diagnostic, Span, did_you_mean
from soagen.dsl.ir import (
    DEFAULT_ALIGN,
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

# How the grammar's terminals read in an error message; a keyword's terminal reads as its words
# (`terminal_words`).
TERMINAL_WORDS: dict[str, str] = {
    "NAME": "a name",
    "STRING": 'a quoted path ("other.soa")',
    "SIGNED_INT": "a number",
    "LBRACE": "`{`",
    "RBRACE": "`}`",
    "LSQB": "`[`",
    "RSQB": "`]`",
    "COMMA": "`,`",
    "EQUAL": "`=`",
    "DOC_COMMENT": "a `///` doc comment",
    "MODULE_DOC": "a `//!` doc comment",
    "INDEXED_NAME": "the name of the input it indexes",
    "_SAME_N": "`n`",
    "SHARED_NAME": "the name of the input whose element count it shares",
    "$END": "the end of the file",
}


@functools.cache
def _lark() -> Lark:
    grammar = resources.files("soagen.dsl").joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


# A terminal that is a keyword: a string literal that reads as a name (`"contiguous"`), or an
# alternation of such literals (`DIRECTION: "input" | "output"`, which Lark joins as `(?:input|output)`).
_LITERAL_ALTERNATION = re.compile(r"\(\?:(\w+(?:\|\w+)*)\)")


@functools.cache
def keywords() -> dict[str, str]:
    """Every keyword of the language and the grammar terminal that reads it (`"indexes"`:
    `"INDEXES"`, `"input"`: `"DIRECTION"`), taken from the grammar itself, so a keyword added to
    `grammar.lark` gets its "did you mean" with no list here to update."""
    table: dict[str, str] = {}
    for terminal in _lark().terminals:
        pattern = terminal.pattern
        if isinstance(pattern, PatternStr):
            words = [pattern.value]
        elif (match := _LITERAL_ALTERNATION.fullmatch(pattern.value)) is not None:
            words = match.group(1).split("|")
        else:
            continue
        table.update((word, terminal.name) for word in words if word.isidentifier())
    return dict(sorted(table.items()))


@functools.cache
def terminal_words() -> dict[str, str]:
    """`TERMINAL_WORDS` with every keyword terminal: `"DIRECTION"`: "`input` or `output`"."""
    spelled: dict[str, list[str]] = {}
    for word, terminal in keywords().items():
        spelled.setdefault(terminal, []).append(f"`{word}`")
    return {**TERMINAL_WORDS, **{t: " or ".join(words) for t, words in spelled.items()}}


def _expected_words(expected: set[str]) -> str:
    names = terminal_words()
    words = sorted({names.get(name, name) for name in expected if name not in _SILENT})
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


def _char_text(char: str) -> str:
    """A character as a message shows it: invisible and control characters by code point."""
    if not char:
        return "the end of the file"
    if char.isprintable() and not char.isspace():
        return f"`{char}`"
    return f"U+{ord(char):04X}"


def _char_hint(char: str) -> str | None:
    if char == '"':
        return "a quoted path must close on the same line"
    if char in "\u201c\u201d\u2018\u2019":
        return 'write straight quotes: import "other.soa"'
    if char.isdigit():
        return "numbers use the ASCII digits 0-9"
    if char == "\ufeff":
        return "a byte order mark may only open the file"
    if char.isspace() or not char.isprintable():
        return "remove this invisible character"
    if not char.isascii():
        return "names use letters, digits and `_`"
    return None


def _end_position(text: str) -> tuple[int, int]:
    """Where the text ends, counting lines as Lark does: split by newline characters only."""
    lines = text.split("\n")
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()  # trailing blank lines: point at the end of the last line with text
    return len(lines), len(lines[-1].rstrip()) + 1


def _syntax_diagnostic(error: UnexpectedInput, path: str, text: str) -> Diagnostic:
    line = error.line if error.line > 0 else max(1, text.count("\n") + 1)
    column = error.column if error.column > 0 else 1
    if isinstance(error, UnexpectedCharacters):
        position = len(text) if error.pos_in_stream is None else error.pos_in_stream
        char = text[position] if position < len(text) else ""
        span = Span(path, line, column, line, column + 1)
        return Diagnostic(
            "SOA001", f"unexpected character {_char_text(char)}", span, _char_hint(char)
        )
    if isinstance(error, UnexpectedToken):
        token = error.token
        previous = _previous_token(error)
        if previous is not None and previous.type == "DOC_COMMENT":
            return _dangling_doc(previous, token, path)
        expected = _expected_words(set(error.expected))
        message = f"unexpected {_token_text(token)}"
        if token.type == "$END":
            message = "unexpected end of file"
        if expected:
            message += f", expected {expected}"
        if token.type == "$END":
            line, column = _end_position(text)
            span = Span(path, line, column, line, column + 1)
        else:
            end_column = token.end_column if token.end_column else column + len(str(token))
            span = Span(path, line, column, token.end_line or line, end_column)
        hint = _syntax_hint(token, set(error.expected))
        return Diagnostic("SOA001", message, span, hint)
    if isinstance(error, UnexpectedEOF):
        expected = _expected_words(set(error.expected))
        line, column = _end_position(text)
        span = Span(path, line, column, line, column + 1)
        message = "unexpected end of file" + (f", expected {expected}" if expected else "")
        return Diagnostic("SOA001", message, span)
    span = Span(path, line, column, line, column + 1)
    return Diagnostic("SOA001", str(error).strip().splitlines()[0], span)


def _previous_token(error: UnexpectedToken) -> Token | None:
    """The token read just before the unexpected one (Lark records none before the end of file)."""
    history = getattr(error, "token_history", None)
    if history:
        last = history[-1]
        return last if isinstance(last, Token) else None
    parser = getattr(error, "interactive_parser", None)
    stack = parser.parser_state.value_stack if parser is not None else []
    return stack[-1] if stack and isinstance(stack[-1], Token) else None


def _dangling_doc(doc: Token, found: Token, path: str) -> Diagnostic:
    """A `///` with no declaration after it: the grammar's "expected" list would only confuse here."""
    line, column = doc.line or 1, doc.column or 1
    span = Span(path, line, column, doc.end_line or line, doc.end_column or column + len(doc))
    return Diagnostic(
        "SOA001",
        f"doc comment is followed by {_token_text(found)}, not by a declaration it could document",
        span,
        "put `///` right above a layout, model, member or binding; write `//` for a plain comment",
    )


# Words that may follow a binding's block; written out of order they get the order as a hint.
_CLAUSE_TOKENS = {"AS", "INDEXES", "SAME", "WHOLE", "CONTIGUOUS"}
_CLAUSE_ORDER = (
    "a binding reads `input NAME = Layout{...} as [...] indexes NAME same n as NAME whole "
    "contiguous`, in that order"
)


def _syntax_hint(token: Token, expected: set[str]) -> str | None:
    if "NAME" in expected and str(token) in keywords():
        return f"`{token}` is a keyword of the .soa language; choose another name"
    if token.type in ("NAME", "INDEXED_NAME"):
        words = [word for word, terminal in keywords().items() if terminal in expected]
        hint = did_you_mean(str(token), words)
        if hint is not None:
            return hint
    if token.type == "$END" and "RBRACE" in expected:
        return "a `{` is not closed"
    if "_SAME_N" in expected or expected == {"AS"}:
        return "the clause reads `same n as NAME`"
    if token.type in _CLAUSE_TOKENS and "DIRECTION" in expected:
        return _CLAUSE_ORDER
    return None


# Far beyond any alignment or extent the checker accepts, and short enough that int() and messages
# stay cheap: Python refuses to convert strings of more than 4300 digits at all.
MAX_DIGITS = 30


def _doc_line(token: Token) -> str:
    body = str(token)[3:]
    # Trailing blanks include the `\r` of CRLF files: the same text gives the same docs either way.
    return (body[1:] if body.startswith(" ") else body).rstrip()


class _Builder:
    """Walks one parse tree into a `SchemaFile`, noting numbers too large to hold."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Diagnostic] = []

    def number(self, token: Token) -> int | None:
        """The value of a number literal; None, and a diagnostic, when it has too many digits."""
        text = str(token)
        digits = text.lstrip("+-").lstrip("0")
        if len(digits) <= MAX_DIGITS:
            return int(text)
        shown = text if len(text) <= 24 else f"{text[:10]}...{text[-10:]}"
        self.problems.append(
            Diagnostic(
                "SOA204",
                f"number `{shown}` has {len(digits)} digits",
                self.span(token),
                f"numbers in a schema have at most {MAX_DIGITS} digits",
            )
        )
        return None

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
            lines.append(_doc_line(token))
        return "\n".join(lines).strip("\n") or None

    @staticmethod
    def split(
        children: list[Token | Tree[Token]],
    ) -> tuple[list[Tree[Token]], list[Token | Tree[Token]]]:
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
                module_docs.append(_doc_line(token))
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
                # A number too large was reported; the default stands in so no other error follows.
                align = self.number(value)
                align_statements.append(
                    (DEFAULT_ALIGN if align is None else align, self.span(value))
                )
                continue
            kind = MemberKind.COLUMN if item.data == "column_stmt" else MemberKind.SCALAR
            dtype_tree, names, *packed = parts
            if packed:
                kind = MemberKind.PACKED
            assert isinstance(dtype_tree, Tree) and isinstance(names, Tree)
            dtype_token = dtype_tree.children[0]
            assert isinstance(dtype_token, Token)
            shape: tuple[int, ...] = ()
            if len(dtype_tree.children) > 1:
                shape_tree = dtype_tree.children[1]
                assert isinstance(shape_tree, Tree)
                shape = tuple(
                    1 if extent is None else extent
                    for extent in (
                        self.number(t) for t in shape_tree.children if isinstance(t, Token)
                    )
                )
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
        clauses = {part.data: part for part in parts[4:] if isinstance(part, Tree)}
        # The one token each clause after the block keeps (its name, or its keyword).
        tokens = {
            clause: child
            for clause in ("indexes", "same_n", "whole", "contiguous")
            if clause in clauses
            for child in clauses[clause].children[:1]
            if isinstance(child, Token)
        }
        indexes, shared = tokens.get("indexes"), tokens.get("same_n")
        whole, contiguous = tokens.get("whole"), tokens.get("contiguous")
        if "axes" in clauses:
            axes_tree = clauses["axes"].children[0]
            assert isinstance(axes_tree, Tree)
            axes_span = self.span(axes_tree)
            written = [self.axis(axis) for axis in axes_tree.children if isinstance(axis, Tree)]
            # An axis number too large was reported; checking the rest of the list would only repeat it.
            axes = None if any(axis is None for axis in written) else tuple(a for a in written if a)
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
            None if indexes is None else str(indexes),
            None if indexes is None else self.span(indexes),
            None if contiguous is None else self.span(contiguous),
            None if shared is None else str(shared),
            None if shared is None else self.span(shared),
            None if whole is None else self.span(whole),
        )

    def axis(self, tree: Tree[Token]) -> Axis | None:
        token = tree.children[0]
        assert isinstance(token, Token)
        if token.type != "SIGNED_INT":
            return Axis(str(token), self.span(token))
        # Extents compare and print as written in canonical form: `+3` and `03` are `3`.
        value = self.number(token)
        return None if value is None else Axis(str(value), self.span(token))


def parse(text: str, path: str) -> tuple[SchemaFile | None, list[Diagnostic]]:
    """Parse one file. Returns the IR (None after a syntax error) and the problems found."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as error:
        return None, [_syntax_diagnostic(error, path, text)]
    builder = _Builder(path)
    schema_file = builder.build(tree)
    return schema_file, builder.problems
