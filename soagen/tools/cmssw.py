"""`soagen import-cmssw`: `.soa` schemas from the `GENERATE_SOA_LAYOUT` definitions of CMSSW headers.

Not a C++ parser: a reader that knows what layout headers hold. It tokenizes each header (comments
kept aside, as member docs), follows its `#include "..."`s under the include folders, and collects
at namespace and class scope what a layout's member types can name: `using`/`typedef` aliases,
enums, classes, `constexpr`/`const` integer constants, object-like `#define`s. Function bodies and
initializers are skipped whole. Names are then resolved as C++ looks them up, well enough: from the
scope of the use outwards. What cannot be resolved or represented is a located SOA6xx diagnostic.

Nothing here imports torch or numpy.
"""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from soagen.dsl.diagnostics import Diagnostic, Span
from soagen.dsl.dtypes import DTYPES, INTEGER_DTYPES
from soagen.dsl.ir import DEFAULT_ALIGN, Layout, Member, MemberKind, SchemaFile
from soagen.dsl.names import COLLECTION_ATTRIBUTES, is_python_keyword

# C++ spellings of the fundamental types, as g++ on x86-64 Linux sizes them (LP64; `char` signed).
FUNDAMENTAL_TYPES: dict[str, str] = {
    **{dtype.cpp_name: name for name, dtype in DTYPES.items() if dtype.cpp_name is not None},
    **{f"std::{name}_t": name for name in INTEGER_DTYPES},
    "char": "int8",
    "signed char": "int8",
    "unsigned char": "uint8",
    "short": "int16",
    "short int": "int16",
    "signed short": "int16",
    "unsigned short": "uint16",
    "unsigned short int": "uint16",
    "int": "int32",
    "signed": "int32",
    "signed int": "int32",
    "unsigned": "uint32",
    "unsigned int": "uint32",
    "long": "int64",
    "long int": "int64",
    "unsigned long": "uint64",
    "unsigned long int": "uint64",
    "long long": "int64",
    "long long int": "int64",
    "unsigned long long": "uint64",
    "unsigned long long int": "uint64",
    "size_t": "uint64",
    "std::size_t": "uint64",
    "std::byte": "uint8",
}
_FUNDAMENTAL_WORDS = frozenset({"signed", "unsigned", "short", "long", "int", "char"})

MEMBER_MACROS = {"SOA_COLUMN": "column", "SOA_EIGEN_COLUMN": "eigen", "SOA_SCALAR": "scalar"}
# Macro arguments of GENERATE_SOA_LAYOUT that declare methods, not members.
METHOD_MACROS = frozenset(
    {
        "SOA_ELEMENT_METHODS",
        "SOA_CONST_ELEMENT_METHODS",
        "SOA_VIEW_METHODS",
        "SOA_CONST_VIEW_METHODS",
    }
)
# Eigen's fixed-size typedefs: `Matrix3f`, `Vector4d`, `RowVector2i`, `Matrix2Xf` (dynamic).
_EIGEN_TYPEDEF = re.compile(r"(Matrix|Vector|RowVector)(\d|X)(X|\d)?(f|d|i|cf|cd)")
_EIGEN_SCALARS = {"f": "float32", "d": "float64", "i": "int32"}
# Eigen::Dynamic is -1.
_EIGEN_DYNAMIC = -1
_MAX_DEPTH = 64  # alias and constant chains longer than this are cycles


class CmsswImportError(Exception):
    """A problem of the import: carries one located diagnostic."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        self.diagnostic = diagnostic
        super().__init__(diagnostic.message)


# --- tokens -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # ident, number, string, punct
    text: str
    path: str
    line: int
    column: int

    @property
    def span(self) -> Span:
        return Span(self.path, self.line, self.column, self.line, self.column + len(self.text))


@dataclass(frozen=True, slots=True)
class Comment:
    text: str
    line: int
    column: int
    end_line: int
    offset: int  # in the file, to order it among tokens


_LEXEME = re.compile(
    r"""
    (?P<space>[ \t\r\f\v]+|\\\r?\n|\n)
    |(?P<comment>//[^\n]*|/\*.*?\*/)
    |(?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
    |(?P<number>\.?\d(?:[eEpP][+-]|[\w.']|)*)
    |(?P<ident>[A-Za-z_]\w*)
    |(?P<punct>::|<<|>>|->|&&|\|\||\S)
    """,
    re.S | re.X,
)
_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n\\]|\\.|\\\n)*", re.M | re.S)
_INCLUDE = re.compile(r'#\s*include\s*(?:"([^"\n]+)"|<([^>\n]+)>)')
_DEFINE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)(?![\w(])[ \t]*(.*)", re.S)


@dataclass(slots=True)
class _Lexed:
    tokens: list[Token]
    offsets: list[int]  # of each token, parallel to `tokens`
    comments: list[Comment]
    includes: list[tuple[str, bool, Span]]  # (target, quoted, where)
    defines: list[tuple[Token, list[Token]]]


_CONDITIONAL = re.compile(r"#\s*(if|ifdef|ifndef|elif|else|endif|undef)\b(.*)", re.S)
_DEFINED = re.compile(r"\bdefined\s*(?:\(\s*([A-Za-z_]\w*)\s*\)|([A-Za-z_]\w*))")
# Macros g++ defines itself on x86-64 Linux (host code: no CUDA, HIP or SYCL macros).
_PREDEFINED = {
    "__cplusplus": 202002,
    "__GNUC__": 12,
    "__x86_64__": 1,
    "__linux__": 1,
    "__STDC_HOSTED__": 1,
    "__LP64__": 1,
    "__CHAR_BIT__": 8,
}


def _condition(kind: str, argument: str, macros: Mapping[str, int | None]) -> bool | None:
    """The value of `#if`/`#ifdef`/`#ifndef`/`#elif ARGUMENT` for a host compile, or None where it
    names a macro that is defined without a value soagen can read (both branches are then read)."""
    argument = argument.strip()
    if kind in ("ifdef", "ifndef"):
        name = argument.split()[0] if argument.split() else ""
        known = name in macros or name in _PREDEFINED
        return known if kind == "ifdef" else not known
    expression = _DEFINED.sub(
        lambda m: (
            "1"
            if (m.group(1) or m.group(2)) in macros or (m.group(1) or m.group(2)) in _PREDEFINED
            else "0"
        ),
        argument,
    )

    def value(match: re.Match[str]) -> str:
        name = match.group()
        if name in _PREDEFINED:
            return str(_PREDEFINED[name])
        if name not in macros:
            return "0"  # the preprocessor's value of a name no #define gave
        known = macros[name]
        return "@" if known is None else str(known)

    expression = re.sub(r"\b(0[xX][\da-fA-F]+|\d+)[uUlL]+\b", r"\1", expression)
    expression = re.sub(r"(?<!\w)[A-Za-z_]\w*", value, expression)
    if (
        "@" in expression
        or "**" in expression
        or not re.fullmatch(r"[\w\s()!&|<>=+\-*/%~^]*", expression)
    ):
        return None
    expression = expression.replace("&&", " and ").replace("||", " or ")
    expression = re.sub(r"!(?!=)", " not ", expression).replace("/", "//")
    try:
        return bool(eval(expression, {"__builtins__": {}}, {}))  # noqa: S307 - digits and operators only
    except Exception:  # noqa: BLE001 - anything it cannot evaluate is read both ways
        return None


def _lex(text: str, path: str, macros: dict[str, int | None] | None = None) -> _Lexed:
    """Tokens, comments, includes and object-like defines of `text`. Conditional compilation
    (`#if`, `#ifdef`, `#ifndef`, `#elif`, `#else`) keeps the branches a host g++ compile keeps,
    with the macros in `macros` (updated by the file's `#define`s and `#undef`s) and g++'s own;
    a condition on a macro whose value cannot be read keeps every branch."""
    macros = {} if macros is None else macros
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def position(offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(line_starts, offset)
        return line, offset - line_starts[line - 1] + 1

    # Directives, and the code of branches a compile drops, become blanks of the same length,
    # so everything else keeps its place.
    directives = [(m.start(), m.end()) for m in _DIRECTIVE.finditer(text)]
    masked = list(text)

    def blank(start: int, end: int) -> None:
        for i in range(start, end):
            if masked[i] != "\n":
                masked[i] = " "

    lexed = _Lexed([], [], [], [], [])
    # Per open conditional: (enclosing code kept, this branch kept, a branch was already taken);
    # `taken` is None where the condition could not be read (every branch kept).
    stack: list[tuple[bool, bool, bool | None]] = []
    kept_from = 0
    for start, end in directives:
        blank(start, end)
        active = all(frame[1] for frame in stack)
        if not active:
            blank(kept_from, start)
        kept_from = end
        directive = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text[start:end], flags=re.S)
        directive = directive.replace("\\\n", " ")
        if (match := _CONDITIONAL.match(directive.strip())) is not None:
            kind, argument = match.group(1), match.group(2)
            if kind in ("if", "ifdef", "ifndef"):
                decided = _condition(kind, argument, macros) if active else False
                stack.append(
                    (
                        active,
                        True if decided is None else decided,
                        None if decided is None else decided,
                    )
                )
            elif kind in ("elif", "else") and stack:
                outer, _, taken = stack[-1]
                if taken is None:
                    stack[-1] = (outer, outer, None)
                elif taken or not outer:
                    stack[-1] = (outer, False, True if taken else False)
                else:
                    decided = True if kind == "else" else _condition("if", argument, macros)
                    stack[-1] = (
                        outer,
                        True if decided is None else decided,
                        None if decided is None else decided,
                    )
            elif kind == "endif" and stack:
                stack.pop()
            elif kind == "undef" and active and argument.split():
                macros.pop(argument.split()[0], None)
            continue
        if not active:
            continue
        line, column = position(start)
        where = Span(path, line, column, line, column + end - start)
        if (match := _INCLUDE.search(directive)) is not None:
            lexed.includes.append((match.group(1) or match.group(2), bool(match.group(1)), where))
        elif (match := _DEFINE.search(directive)) is not None:
            name_offset = start + text[start:end].index(match.group(1))
            name = Token("ident", match.group(1), path, *position(name_offset))
            value_offset = start + match.start(2)
            value = [
                Token(t.kind, t.text, path, *position(value_offset + o))
                for t, o in _tokens(directive[match.start(2) :], path, 0, [])
            ]
            lexed.defines.append((name, value))
            number = value[0].text.rstrip("uUlL") if len(value) == 1 else ""
            macros[name.text] = (
                int(number, 0)
                if re.fullmatch(r"0[xX][\da-fA-F]+|\d+", number)
                else (0 if not value else None)
            )
        elif (match := re.match(r"#\s*define\s+([A-Za-z_]\w*)", directive.strip())) is not None:
            macros[match.group(1)] = None  # a function-like macro
    if any(not frame[1] for frame in stack):
        blank(kept_from, len(text))
    body = "".join(masked)
    for token, offset in _tokens(body, path, 0, lexed.comments, position):
        lexed.tokens.append(token)
        lexed.offsets.append(offset)
    return lexed


def _tokens(
    text: str,
    path: str,
    base: int,
    comments: list[Comment],
    position: Callable[[int], tuple[int, int]] | None = None,
) -> Iterator[tuple[Token, int]]:
    """Tokens with their offsets; comments are appended to `comments` where `position` is given."""
    at = 0
    while at < len(text):
        match = _LEXEME.match(text, at)
        if match is None:  # pragma: no cover - the last alternative matches any character
            break
        kind = match.lastgroup or "punct"
        lexeme = match.group()
        offset = base + at
        at = match.end()
        if kind == "space":
            continue
        line, column = position(offset) if position is not None else (1, offset + 1)
        if kind == "comment":
            if position is not None:
                end_line = position(offset + len(lexeme) - 1)[0]
                comments.append(Comment(lexeme, line, column, end_line, offset))
            continue
        yield Token(kind, lexeme, path, line, column), offset


# --- declarations -------------------------------------------------------------------------------

Scope = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Alias:
    tokens: tuple[Token, ...]
    scope: Scope


@dataclass(frozen=True, slots=True)
class Enum:
    underlying: tuple[Token, ...]  # empty: no fixed type
    scoped: bool
    scope: Scope
    name: Token


@dataclass(frozen=True, slots=True)
class Class:
    name: Token
    template: bool


@dataclass(frozen=True, slots=True)
class Constant:
    name: Token
    # The initializer; None for an enumerator without one: `previous` + 1, or 0 without one.
    tokens: tuple[Token, ...] | None
    scope: Scope
    previous: Scope | None = None


Symbol = Alias | Enum | Class | Constant


@dataclass(frozen=True, slots=True)
class LayoutCall:
    name: Token
    scope: Scope
    path: str
    arguments: tuple[tuple[Token, ...], ...]  # split at top-level commas, the name excluded
    end: Token  # the closing parenthesis


@dataclass(slots=True)
class _Declarations:
    symbols: dict[Scope, Symbol] = field(default_factory=dict)
    layouts: list[LayoutCall] = field(default_factory=list)
    # Per file: `using X = NameLayout<...>;` aliases, (target name, template arguments, scope).
    layout_aliases: list[tuple[str, str, tuple[Token, ...], Scope]] = field(default_factory=list)

    def add(self, key: Scope, symbol: Symbol) -> None:
        self.symbols.setdefault(key, symbol)


_OPEN = {"(": ")", "[": "]", "{": "}"}


class _Parser:
    """Collects the declarations of one file's tokens."""

    def __init__(self, tokens: list[Token], declarations: _Declarations) -> None:
        self.tokens = tokens
        self.at = 0
        self.out = declarations

    def peek(self, ahead: int = 0) -> Token | None:
        index = self.at + ahead
        return self.tokens[index] if index < len(self.tokens) else None

    def text(self, ahead: int = 0) -> str:
        token = self.peek(ahead)
        return token.text if token is not None else ""

    def balanced(self) -> list[Token]:
        """The tokens of the bracketed group that starts here, brackets included."""
        start, depth = self.at, 0
        while self.at < len(self.tokens):
            text = self.tokens[self.at].text
            self.at += 1
            if text in _OPEN:
                depth += 1
            elif text in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    break
        return self.tokens[start : self.at]

    def angle_group(self) -> list[Token]:
        """`<...>` starting here (template arguments or parameters), `>>` closing two."""
        start, depth = self.at, 0
        while self.at < len(self.tokens):
            text = self.tokens[self.at].text
            if text in _OPEN:
                self.balanced()
                continue
            self.at += 1
            if text == "<":
                depth += 1
            elif text == ">":
                depth -= 1
            elif text == ">>":
                depth -= 2
            elif text == ";":
                break
            if depth <= 0:
                break
        return self.tokens[start : self.at]

    def scope_body(self, scope: Scope, template: bool = False) -> None:
        """Declarations up to the `}` closing this scope (consumed) or the end of the file."""
        while (token := self.peek()) is not None:
            if token.text == "}":
                self.at += 1
                return
            self.declaration(scope, template)

    def declaration(self, scope: Scope, template: bool) -> None:
        token = self.peek()
        assert token is not None
        text = token.text
        if text == ";":
            self.at += 1
        elif text == "{":
            self.at += 1
            self.scope_body(scope, template)
        elif text == "template":
            self.at += 1
            if self.text() == "<":
                self.angle_group()
            if self.peek() is not None and self.text() != "}":
                self.declaration(scope, True)
        elif text in ("inline", "export") and self.text(1) == "namespace":
            self.at += 1
        elif text == "namespace":
            self.namespace(scope)
        elif text == "extern" and self.peek(1) is not None and self.peek(1).kind == "string":  # type: ignore[union-attr]
            self.at += 2
        elif text in ("public", "private", "protected") and self.text(1) == ":":
            self.at += 2
        elif text == "using":
            self.using(scope)
        elif text == "typedef":
            self.typedef(scope)
        elif text == "enum":
            self.enum(scope)
        elif text in ("class", "struct", "union") and self.class_ahead():
            self.class_(scope, template)
        elif (
            token.kind == "ident"
            and re.fullmatch(r"[A-Z][A-Z0-9_]*", text)
            and (self.text(1) == "(")
        ):
            self.macro_call(scope)
        else:
            self.statement(scope)

    def namespace(self, scope: Scope) -> None:
        self.at += 1
        names: list[str] = []
        while (token := self.peek()) is not None and token.text not in ("{", "=", ";"):
            if token.kind == "ident" and token.text != "inline":
                names.append(token.text)
            self.at += 1
        if self.text() == "{":
            self.at += 1
            # An anonymous namespace's names are visible in the enclosing one.
            self.scope_body((*scope, *names))
        else:
            self.skip_statement()

    def class_ahead(self) -> bool:
        """A class definition or declaration, not `struct X x;` or an elaborated use."""
        index = self.at + 1
        while index < len(self.tokens) and self.tokens[index].text in ("alignas", "["):
            index += 1
        return index < len(self.tokens) and self.tokens[index].kind == "ident"

    def class_(self, scope: Scope, template: bool) -> None:
        self.at += 1
        name: Token | None = None
        while (token := self.peek()) is not None and token.text not in ("{", ";"):
            if token.text in _OPEN:
                self.balanced()
                continue
            if token.text == "<" and name is not None:
                self.angle_group()  # a specialization's arguments
                continue
            if token.text == ":":
                # Base classes, up to the body.
                while (token := self.peek()) is not None and token.text not in ("{", ";"):
                    if token.text == "<":
                        self.angle_group()
                    else:
                        self.at += 1
                break
            if name is None and token.kind == "ident" and token.text not in ("final", "alignas"):
                name = token
            self.at += 1
        if name is not None:
            self.out.add((*scope, name.text), Class(name, template))
        if self.text() == "{":
            self.at += 1
            self.scope_body((*scope, name.text) if name is not None else scope, template)
            self.skip_statement()  # declarators after the body, up to `;`
        else:
            self.at += 1

    def enum(self, scope: Scope) -> None:
        self.at += 1
        scoped = self.text() in ("class", "struct")
        if scoped:
            self.at += 1
        name: Token | None = None
        if (token := self.peek()) is not None and token.kind == "ident":
            name = token
            self.at += 1
        underlying: list[Token] = []
        if self.text() == ":":
            self.at += 1
            while (token := self.peek()) is not None and token.text not in ("{", ";"):
                underlying.append(token)
                self.at += 1
        if name is not None:
            self.out.add((*scope, name.text), Enum(tuple(underlying), scoped, scope, name))
        if self.text() != "{":
            self.skip_statement()
            return
        body = self.balanced()[1:-1]
        inner = (*scope, name.text) if scoped and name is not None else scope
        previous: Scope | None = None
        for enumerator in _split(body, ","):
            if not enumerator or enumerator[0].kind != "ident":
                continue
            key = (*inner, enumerator[0].text)
            value = (
                tuple(enumerator[2:]) if len(enumerator) > 2 and enumerator[1].text == "=" else None
            )
            self.out.add(key, Constant(enumerator[0], value, inner, previous))
            if not scoped and name is not None:
                # Unscoped enumerators are also reachable as `Enum::name`.
                self.out.add(
                    (*scope, name.text, enumerator[0].text),
                    Constant(enumerator[0], value, inner, previous),
                )
            previous = key
        self.skip_statement()

    def using(self, scope: Scope) -> None:
        self.at += 1
        if self.text() == "namespace":
            self.skip_statement()
            return
        name = self.peek()
        statement = self.skip_statement()
        if name is None or name.kind != "ident":
            return
        if len(statement) > 2 and statement[1].text == "=":
            target = tuple(t for t in statement[2:] if t.text not in (";", "typename"))
            self.out.add((*scope, name.text), Alias(target, scope))
            self.layout_alias(target, scope)
        elif len(statement) > 2 and statement[-1].text == ";" and statement[-2].kind == "ident":
            # `using ns::Name;`: the name as it is in `ns`.
            self.out.add((*scope, statement[-2].text), Alias(tuple(statement[:-1]), scope))

    def layout_alias(self, target: tuple[Token, ...], scope: Scope) -> None:
        """`using FooSoA = FooLayout<64>;`: remembered for the layout's alignment."""
        names = [t for t in target]
        if "<" not in [t.text for t in names]:
            return
        open_at = [t.text for t in names].index("<")
        head = names[:open_at]
        if not head or head[-1].kind != "ident":
            return
        arguments = tuple(names[open_at + 1 : -1]) if names[-1].text == ">" else ()
        path = head[-1].path
        self.out.layout_aliases.append((head[-1].text, path, arguments, scope))

    def typedef(self, scope: Scope) -> None:
        statement = self.skip_statement()
        body = [t for t in statement[1:] if t.text != ";"]
        if any(t.text in ("{", "(") for t in body) or len(body) < 2 or body[-1].kind != "ident":
            return
        self.out.add((*scope, body[-1].text), Alias(tuple(body[:-1]), scope))

    def macro_call(self, scope: Scope) -> None:
        name = self.tokens[self.at]
        self.at += 1
        group = self.balanced()
        if name.text == "GENERATE_SOA_LAYOUT" and len(group) >= 2:
            arguments = _split(group[1:-1], ",")
            if arguments and len(arguments[0]) == 1 and arguments[0][0].kind == "ident":
                call = LayoutCall(
                    arguments[0][0],
                    scope,
                    name.path,
                    tuple(tuple(a) for a in arguments[1:]),
                    group[-1],
                )
                self.out.layouts.append(call)
        if self.text() == ";":
            self.at += 1

    def skip_statement(self) -> list[Token]:
        """Tokens up to and including `;` at depth 0, bracketed groups whole."""
        start = self.at
        while (token := self.peek()) is not None:
            if token.text in _OPEN:
                self.balanced()
                continue
            if token.text == "}":
                break  # the end of the enclosing scope: a statement without `;`
            self.at += 1
            if token.text == ";":
                break
        return self.tokens[start : self.at]

    def statement(self, scope: Scope) -> None:
        """Anything else: a constant's declaration is recorded; a function's body is skipped."""
        start = self.at
        seen_call = seen_assign = False
        while (token := self.peek()) is not None:
            text = token.text
            if text == "{":
                if seen_call and not seen_assign:  # a function body ends the statement
                    self.balanced()
                    if self.text() == ";":
                        self.at += 1
                    return
                self.balanced()
                continue
            if text in ("(", "["):
                seen_call = seen_call or text == "("
                self.balanced()
                continue
            if text == "}":
                break
            self.at += 1
            if text == "=":
                seen_assign = True
            if text == ";":
                break
        statement = self.tokens[start : self.at]
        words = {t.text for t in statement}
        if ("constexpr" in words or "const" in words) and "operator" not in words:
            self.constants(statement, scope)

    def constants(self, statement: list[Token], scope: Scope) -> None:
        body = statement[:-1] if statement and statement[-1].text == ";" else statement
        for number, declarator in enumerate(_split(body, ",")):
            split = next(
                (i for i, t in enumerate(declarator) if t.text in ("=", "{", "(")),
                None,
            )
            if split is None or split == 0 or declarator[split - 1].kind != "ident":
                continue
            if declarator[split].text == "(" and number == 0 and split >= 1:
                # `int f(int)`: a function, unless it is `T name(value)` with a literal.
                if not any(t.kind == "number" for t in declarator[split:]):
                    continue
            name = declarator[split - 1]
            value = declarator[split + 1 :]
            if declarator[split].text in ("{", "(") and value:
                value = value[:-1]
            self.out.add((*scope, name.text), Constant(name, tuple(value), scope))


def _split(tokens: Sequence[Token], separator: str) -> list[list[Token]]:
    """Split at `separator` outside (), [], {} and template arguments `<...>` of a name."""
    parts: list[list[Token]] = [[]]
    depth = angle = 0
    previous: Token | None = None
    for token in tokens:
        text = token.text
        if text in _OPEN:
            depth += 1
        elif text in (")", "]", "}"):
            depth -= 1
        elif depth == 0 and text == "<" and previous is not None and previous.kind == "ident":
            angle += 1
        elif depth == 0 and angle and text == ">":
            angle -= 1
        elif depth == 0 and angle and text == ">>":
            angle = max(0, angle - 2)
        if text == separator and depth == 0 and angle == 0:
            parts.append([])
        else:
            parts[-1].append(token)
        previous = token
    return parts if parts != [[]] else []


# --- reading headers ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Reader:
    include_dirs: tuple[Path, ...]
    declarations: _Declarations = field(default_factory=_Declarations)
    sources: dict[str, str] = field(default_factory=dict)
    comments: dict[str, list[Comment]] = field(default_factory=dict)
    offsets: dict[str, dict[tuple[int, int], int]] = field(default_factory=dict)
    seen: set[Path] = field(default_factory=set)
    # Macros for conditional compilation: `--define`s of plain names, then each `#define` read.
    macros: dict[str, int | None] = field(default_factory=dict)

    def read(self, path: Path, shown: str) -> None:
        resolved = path.resolve()
        if resolved in self.seen:
            return
        self.seen.add(resolved)
        text = path.read_text(encoding="utf-8", errors="replace")
        self.sources[shown] = text
        lexed = _lex(text, shown, self.macros)
        self.comments[shown] = lexed.comments
        self.offsets[shown] = {
            (t.line, t.column): o for t, o in zip(lexed.tokens, lexed.offsets, strict=True)
        }
        # Included declarations come first, as the preprocessor would paste them.
        for target, quoted, _ in lexed.includes:
            found = self.find_include(target, path.parent if quoted else None)
            if found is not None:
                self.read(found, _shown_path(found))
        for name, value in lexed.defines:
            self.declarations.add((name.text,), Constant(name, tuple(value), ()))
        _Parser(lexed.tokens, self.declarations).scope_body(())

    def find_include(self, target: str, near: Path | None) -> Path | None:
        folders = ([near] if near is not None else []) + list(self.include_dirs)
        for folder in folders:
            candidate = folder / target
            if candidate.is_file():
                return candidate
        return None


def _shown_path(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# --- resolving types and constants --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TypeMapping:
    """What `--type NAME=dtype[extents]` maps a C++ type to."""

    dtype: str
    shape: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        return self.dtype + (f"[{', '.join(map(str, self.shape))}]" if self.shape else "")


def parse_type_mapping(text: str) -> tuple[str, TypeMapping]:
    """`NAME=dtype` or `NAME=dtype[a, b]`; ValueError says what is wrong."""
    name, equals, value = text.partition("=")
    match = re.fullmatch(r"\s*(\w+)\s*(?:\[([\d\s,]+)\])?\s*", value)
    if not equals or not name.strip() or match is None:
        raise ValueError(f"--type {text!r}: write NAME=dtype or NAME=dtype[extents]")
    if match.group(1) not in DTYPES:
        raise ValueError(
            f"--type {text!r}: unknown dtype {match.group(1)!r}; one of {', '.join(DTYPES)}"
        )
    shape = tuple(int(e) for e in match.group(2).split(",")) if match.group(2) else ()
    if len(shape) > 2 or any(e <= 0 for e in shape):
        raise ValueError(f"--type {text!r}: at most two positive extents")
    return _normal(name), TypeMapping(match.group(1), shape)


def parse_define(text: str) -> tuple[str, int]:
    name, equals, value = text.partition("=")
    try:
        number = int(value.strip(), 0)
    except ValueError:
        number = None
    if not equals or not name.strip() or number is None:
        raise ValueError(f"--define {text!r}: write NAME=INTEGER")
    return _normal(name), number


def _normal(name: str) -> str:
    """A C++ name without spaces or a leading `::`: `Eigen ::Matrix` -> `Eigen::Matrix`."""
    return re.sub(r"\s+", "", name).removeprefix("::")


def _joined(tokens: Sequence[Token]) -> str:
    text = ""
    for token in tokens:
        if text and token.kind in ("ident", "number") and text[-1:].isalnum() | (text[-1:] == "_"):
            text += " "
        text += token.text
    return text


@dataclass(frozen=True, slots=True)
class _Type:
    dtype: str
    shape: tuple[int, ...]
    form: str  # "value", "eigen" (an Eigen matrix) or "packed" (an array stored in place)
    notes: tuple[str, ...] = ()


@dataclass(slots=True)
class _Resolver:
    declarations: _Declarations
    types: Mapping[str, TypeMapping]
    defines: Mapping[str, int]
    values: dict[Scope, int] = field(default_factory=dict)
    # The member's type as written, for hints: `--type` maps that name wherever it leads.
    outer: str = ""

    def lookup(
        self, parts: Sequence[str], scope: Scope, absolute: bool, depth: int = 0
    ) -> tuple[Scope, Symbol] | None:
        scopes = [()] if absolute else [scope[:i] for i in range(len(scope), -1, -1)]
        for outer in scopes:
            key = (*outer, *parts)
            symbol = self.declarations.symbols.get(key)
            if symbol is not None:
                return key, symbol
        # `Alias::member`: a member of the class the alias names; `typedef Tmpl<X> Alias;`
        # reaches what the class template declares.
        for cut in range(len(parts) - 1, 0, -1):
            if depth > _MAX_DEPTH:
                break
            head = self.lookup(parts[:cut], scope, absolute, depth + 1)
            if head is None or not isinstance(head[1], Alias):
                continue
            target = list(head[1].tokens)
            target_absolute = bool(target) and target[0].text == "::"
            names, _, rest = _qualified(target[1:] if target_absolute else target)
            if not names or rest:
                continue
            found = self.lookup([*names, *parts[cut:]], head[1].scope, target_absolute, depth + 1)
            if found is not None:
                return found
        return None

    # Types ----------------------------------------------------------------------------------

    def type_of(self, tokens: Sequence[Token], scope: Scope, depth: int = 0) -> _Type:
        words = [
            t for t in tokens if t.text not in ("const", "volatile", "typename", "struct", "class")
        ]
        if not words:
            raise _error(
                "SOA601", "a member without a type", tokens[0].span if tokens else _nowhere()
            )
        written = _normal("".join(t.text for t in words))
        if written in self.types:
            return self.mapped(written, words[0])
        spaced = " ".join(t.text for t in words)
        if all(t.text in _FUNDAMENTAL_WORDS for t in words) and spaced in FUNDAMENTAL_TYPES:
            return _Type(FUNDAMENTAL_TYPES[spaced], (), "value")
        if written in FUNDAMENTAL_TYPES:
            return _Type(FUNDAMENTAL_TYPES[written], (), "value")
        absolute = words[0].text == "::"
        parts, arguments, rest = _qualified(words[1:] if absolute else words)
        if not parts or rest:
            raise _error("SOA603", f"cannot read the type `{_joined(words)}`", words[0].span)
        if depth > _MAX_DEPTH:
            raise _error("SOA603", f"the type `{_joined(words)}` refers to itself", words[0].span)
        found = self.lookup(parts, scope, absolute)
        qualified = "::".join(found[0]) if found is not None else "::".join(parts)
        if qualified in self.types:
            return self.mapped(qualified, words[0])
        well_known = self.well_known(qualified, arguments, words, scope, depth)
        if well_known is not None:
            return well_known
        if found is None:
            raise _error(
                "SOA601",
                f"unknown type `{_joined(words)}`",
                words[0].span,
                f"map it: --type {'::'.join(parts)}=DTYPE (a dtype, or uint8[SIZE] for a struct of "
                "SIZE bytes); or add the folder its header is found under with -I",
            )
        key, symbol = found
        if isinstance(symbol, Alias):
            if arguments is not None:
                raise _error("SOA603", f"alias template `{_joined(words)}`", words[0].span)
            return self.type_of(symbol.tokens, symbol.scope, depth + 1)
        if isinstance(symbol, Enum):
            return self.enum_type(symbol, key, words[0])
        if isinstance(symbol, Class):
            shown = _joined(words)
            raise _error(
                "SOA603",
                f"`{shown}` is a class: soagen columns hold numbers, not structs",
                words[0].span,
                f"if its bytes are opaque to you, map it to bytes of its size: --type "
                f"'{self.outer or shown}=uint8[SIZE]' (SIZE = sizeof({shown}) in C++)",
            )
        raise _error("SOA603", f"`{_joined(words)}` is a constant, not a type", words[0].span)

    def mapped(self, name: str, where: Token) -> _Type:
        mapping = self.types[name]
        note = f"imported: {name} as {mapping.text} (--type)"
        return _Type(mapping.dtype, mapping.shape, "packed" if mapping.shape else "value", (note,))

    def enum_type(self, enum: Enum, key: Scope, where: Token) -> _Type:
        qualified = "::".join(key)
        if enum.underlying:
            underlying = self.type_of(enum.underlying, enum.scope)
            if underlying.dtype not in INTEGER_DTYPES or underlying.shape:
                raise _error(
                    "SOA603", f"enum `{qualified}` has no integer type", enum.underlying[0].span
                )
            return _Type(underlying.dtype, (), "value", (f"imported: {qualified} (enum)",))
        if enum.scoped:  # an `enum class` without a type is `int`
            return _Type("int32", (), "value", (f"imported: {qualified} (enum class, int)",))
        # An unscoped enum without a fixed type has an implementation-defined type; g++ makes it
        # 4 bytes (int, or unsigned int) whenever its values fit, as they do in CMSSW's.
        return _Type(
            "int32",
            (),
            "value",
            (f"imported: {qualified} (enum without a fixed type: 4 bytes with g++)",),
        )

    def well_known(
        self,
        qualified: str,
        arguments: list[list[Token]] | None,
        words: Sequence[Token],
        scope: Scope,
        depth: int,
    ) -> _Type | None:
        where = words[0]
        if qualified in ("edm::StdArray", "std::array"):
            if arguments is None or len(arguments) != 2:
                raise _error("SOA603", f"`{qualified}` needs two template arguments", where.span)
            inner = self.type_of(arguments[0], scope, depth + 1)
            extent = self.constant(arguments[1], scope)
            if inner.form == "eigen":
                raise _error("SOA603", f"`{qualified}` of Eigen matrices", where.span)
            shape = (extent, *inner.shape)
            if len(shape) > 2:
                raise _error(
                    "SOA603",
                    f"`{_joined(words)}` has {len(shape)} dimensions; packed columns hold at most 2",
                    where.span,
                )
            return _Type(inner.dtype, shape, "packed", inner.notes)
        if not qualified.startswith("Eigen::"):
            return None
        name = qualified.removeprefix("Eigen::")
        if name in ("Matrix", "Vector", "RowVector", "Array"):
            if arguments is None or len(arguments) < (3 if name in ("Matrix", "Array") else 2):
                raise _error("SOA603", f"`Eigen::{name}` without its sizes", where.span)
            scalar = self.type_of(arguments[0], scope, depth + 1)
            if scalar.shape or scalar.form != "value":
                raise _error("SOA603", f"`Eigen::{name}` of arrays", where.span)
            sizes = [
                self.constant(a, scope)
                for a in arguments[1 : 3 if name in ("Matrix", "Array") else 2]
            ]
            if name == "Vector":
                sizes.append(1)
            elif name == "RowVector":
                sizes.insert(0, 1)
            return self.eigen(scalar.dtype, sizes[0], sizes[1], where, scalar.notes)
        match = _EIGEN_TYPEDEF.fullmatch(name)
        if match is None:
            return None
        kind, first, second, suffix = match.groups()
        if suffix not in _EIGEN_SCALARS:
            raise _error("SOA603", f"`{qualified}` holds complex numbers", where.span)
        size = _EIGEN_DYNAMIC if first == "X" else int(first)
        other = size if second is None else (_EIGEN_DYNAMIC if second == "X" else int(second))
        rows, columns = {"Matrix": (size, other), "Vector": (size, 1), "RowVector": (1, size)}[kind]
        return self.eigen(_EIGEN_SCALARS[suffix], rows, columns, where, ())

    def eigen(
        self, dtype: str, rows: int, columns: int, where: Token, notes: tuple[str, ...]
    ) -> _Type:
        if rows <= 0 or columns <= 0:
            raise _error(
                "SOA603",
                "an Eigen matrix of dynamic size: a column needs sizes fixed at compile time",
                where.span,
            )
        shape = (rows,) if columns == 1 else (rows, columns)
        return _Type(dtype, shape, "eigen", notes)

    # Constants ------------------------------------------------------------------------------

    def constant(self, tokens: Sequence[Token], scope: Scope) -> int:
        if not tokens:
            raise _error("SOA602", "an empty constant expression", _nowhere())
        return _Expression(self, list(tokens), scope).value()

    def named(
        self, parts: list[str], where: Token, scope: Scope, absolute: bool, depth: int
    ) -> int:
        written = "::".join(parts)
        if written in self.defines:
            return self.defines[written]
        found = self.lookup(parts, scope, absolute)
        if found is not None and "::".join(found[0]) in self.defines:
            return self.defines["::".join(found[0])]
        symbol = found[1] if found is not None else None
        if found is None or not isinstance(symbol, Constant) or depth > _MAX_DEPTH:
            raise _error(
                "SOA602",
                f"unknown constant `{written}`",
                where.span,
                f"give its value: --define {written}=VALUE; or add the folder its header is "
                "found under with -I",
            )
        key = found[0]
        if key in self.values:
            return self.values[key]
        if symbol.tokens is None:
            value = (
                0
                if symbol.previous is None
                else self.named(list(symbol.previous), where, (), True, depth + 1) + 1
            )
        elif not symbol.tokens:
            raise _error("SOA602", f"constant `{written}` has no value", symbol.name.span)
        else:
            value = _Expression(self, list(symbol.tokens), symbol.scope, depth + 1).value()
        self.values[key] = value
        return value


_OPERATORS: dict[str, Callable[[int, int], int]] = {
    "|": operator.or_,
    "^": operator.xor,
    "&": operator.and_,
    "<<": operator.lshift,
    ">>": operator.rshift,
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    # C++ divides towards zero.
    "/": lambda a, b: abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1),
    "%": lambda a, b: a - abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) * b,
}


class _Expression:
    """An integer constant expression: literals, names, + - * / % << >> & | ^ ~ ! and parentheses,
    `static_cast<T>(x)` and `sizeof` of a type soagen knows."""

    _BINARY = (("|",), ("^",), ("&",), ("<<", ">>"), ("+", "-"), ("*", "/", "%"))

    def __init__(
        self, resolver: _Resolver, tokens: list[Token], scope: Scope, depth: int = 0
    ) -> None:
        self.resolver = resolver
        self.tokens = tokens
        self.scope = scope
        self.depth = depth
        self.at = 0

    def value(self) -> int:
        result = self.binary(0)
        if self.at != len(self.tokens):
            token = self.tokens[self.at]
            raise _error(
                "SOA602", f"cannot evaluate `{_joined(self.tokens)}` as an integer", token.span
            )
        return result

    def peek(self) -> str:
        return self.tokens[self.at].text if self.at < len(self.tokens) else ""

    def binary(self, level: int) -> int:
        if level == len(self._BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in self._BINARY[level]:
            sign = self.tokens[self.at]
            self.at += 1
            right = self.binary(level + 1)
            if sign.text in ("/", "%") and right == 0:
                raise _error("SOA602", "division by zero in a constant", sign.span)
            left = _OPERATORS[sign.text](left, right)
        return left

    def unary(self) -> int:
        if self.at >= len(self.tokens):
            where = self.tokens[-1].span if self.tokens else _nowhere()
            raise _error("SOA602", "a constant expression ends early", where)
        token = self.tokens[self.at]
        if token.text in ("-", "+", "~", "!"):
            self.at += 1
            operand = self.unary()
            return {"-": -operand, "+": operand, "~": ~operand, "!": int(not operand)}[token.text]
        if token.text == "(":
            self.at += 1
            result = self.binary(0)
            self.expect(")")
            return result
        if token.kind == "number":
            self.at += 1
            return _integer(token)
        if token.text in ("true", "false"):
            self.at += 1
            return int(token.text == "true")
        if token.text in ("static_cast", "int", "unsigned", "size_t") or token.text == "sizeof":
            return self.cast_or_sizeof(token)
        absolute = token.text == "::"
        if absolute:
            self.at += 1
        parts: list[str] = []
        first = self.tokens[self.at] if self.at < len(self.tokens) else token
        while self.at < len(self.tokens) and self.tokens[self.at].kind == "ident":
            parts.append(self.tokens[self.at].text)
            self.at += 1
            if self.peek() != "::":
                break
            self.at += 1
        if not parts:
            raise _error(
                "SOA602", f"cannot evaluate `{_joined(self.tokens)}` as an integer", token.span
            )
        return self.resolver.named(parts, first, self.scope, absolute, self.depth)

    def expect(self, text: str) -> None:
        if self.peek() != text:
            where = self.tokens[min(self.at, len(self.tokens) - 1)].span
            raise _error("SOA602", f"expected `{text}` in `{_joined(self.tokens)}`", where)
        self.at += 1

    def cast_or_sizeof(self, token: Token) -> int:
        self.at += 1
        if token.text == "static_cast":
            self.expect("<")
            while self.at < len(self.tokens) and self.peek() != ">":
                self.at += 1
            self.expect(">")
        elif token.text == "sizeof":
            self.expect("(")
            start = self.at
            depth = 1
            while self.at < len(self.tokens):
                depth += {"(": 1, ")": -1}.get(self.peek(), 0)
                if depth == 0:
                    break
                self.at += 1
            kind = self.resolver.type_of(self.tokens[start : self.at], self.scope)
            self.expect(")")
            count = 1
            for extent in kind.shape:
                count *= extent
            return DTYPES[kind.dtype].itemsize * count
        self.expect("(")
        result = self.binary(0)
        self.expect(")")
        return result


def _integer(token: Token) -> int:
    text = token.text.replace("'", "")
    digits = re.fullmatch(r"(0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)[uUlLzZ]*", text)
    if digits is None:
        raise _error("SOA602", f"`{token.text}` is not an integer", token.span)
    number = digits.group(1)
    if number.startswith(("0x", "0X", "0b", "0B")):
        return int(number, 0)
    return int(number, 8) if len(number) > 1 and number.startswith("0") else int(number)


def _qualified(tokens: Sequence[Token]) -> tuple[list[str], list[list[Token]] | None, list[Token]]:
    """`a::b::c<args>` -> (["a", "b", "c"], the template arguments or None, what follows)."""
    parts: list[str] = []
    at = 0
    arguments: list[list[Token]] | None = None
    while at < len(tokens) and tokens[at].kind == "ident":
        parts.append(tokens[at].text)
        at += 1
        if at < len(tokens) and tokens[at].text == "<":
            close = _closing_angle(tokens, at)
            inner = list(tokens[at + 1 : close])
            arguments = _split(inner, ",")
            at = close + 1
            if at < len(tokens) and tokens[at].text == "::":
                # `Outer<T>::Inner`: a member of a template instance; not representable.
                return parts, arguments, list(tokens[at:])
            break
        if at < len(tokens) and tokens[at].text == "::":
            at += 1
            continue
        break
    return parts, arguments, list(tokens[at:])


def _closing_angle(tokens: Sequence[Token], start: int) -> int:
    depth = 0
    for index in range(start, len(tokens)):
        text = tokens[index].text
        if text == "<":
            depth += 1
        elif text == ">":
            depth -= 1
        elif text == ">>":
            depth -= 2
        if depth <= 0:
            return index
    return len(tokens)


def _error(code: str, message: str, span: Span, hint: str | None = None) -> CmsswImportError:
    return CmsswImportError(Diagnostic(code, message, span, hint))


def _nowhere() -> Span:
    return Span("<command line>", 1, 1, 1, 1)


# --- layouts ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeaderImport:
    """One header's layouts as a schema file, or why not."""

    schema_file: SchemaFile | None
    diagnostics: list[Diagnostic]
    sources: dict[str, str]


def layout_name(class_name: str) -> str:
    """`PFRecHitSoALayout` -> `PFRecHitSoA`, `ParticleLayout` -> `Particle`; others as they are."""
    stem = class_name.removesuffix("Layout")
    return stem if stem and class_name.endswith("Layout") else class_name


def schema_stem(header: Path) -> str:
    """The .soa file's stem for a header: the header's stem, each character that cannot be in a
    Python module name replaced by `_` (`PFRecHitSoA.h` -> `PFRecHitSoA`)."""
    stem = re.sub(r"\W", "_", header.stem, flags=re.ASCII) or "_"
    return f"_{stem}" if stem[0].isdigit() else stem


def import_header(
    header: Path,
    *,
    shown: str,
    schema_path: str,
    include_dirs: Sequence[Path] = (),
    types: Mapping[str, TypeMapping] | None = None,
    defines: Mapping[str, int] | None = None,
    layouts: Sequence[str] = (),
) -> HeaderImport:
    """Read `header` (and what it includes) and build the schema file of its layouts (those named
    in `layouts`, if any), or the diagnostics that say why not."""
    reader = _Reader(tuple(include_dirs))
    reader.macros.update(
        {name: value for name, value in (defines or {}).items() if re.fullmatch(r"\w+", name)}
    )
    reader.read(header, shown)
    declarations = reader.declarations
    resolver = _Resolver(declarations, dict(types or {}), dict(defines or {}))
    own = [call for call in declarations.layouts if call.path == shown]
    wanted = set(layouts)
    diagnostics: list[Diagnostic] = []
    if wanted:
        known = {call.name.text for call in own} | {layout_name(call.name.text) for call in own}
        for name in sorted(wanted - known):
            diagnostics.append(
                Diagnostic(
                    "SOA604",
                    f"`{shown}` declares no layout `{name}`",
                    Span(shown, 1, 1, 1, 1),
                    "its layouts are " + (", ".join(c.name.text for c in own) or "none"),
                )
            )
        own = [c for c in own if c.name.text in wanted or layout_name(c.name.text) in wanted]
    elif not own:
        diagnostics.append(
            Diagnostic(
                "SOA604",
                f"`{shown}` has no GENERATE_SOA_LAYOUT",
                Span(shown, 1, 1, 1, 1),
                "name the header that declares the layout; the ones it includes are read for "
                "the types and constants only",
            )
        )
    built: list[Layout] = []
    for call in own:
        try:
            built.append(_layout(call, reader, resolver, schema_path))
        except CmsswImportError as error:
            diagnostics.append(error.diagnostic)
    if diagnostics:
        return HeaderImport(None, diagnostics, reader.sources)
    doc = f"Imported from {shown} by soagen import-cmssw."
    return HeaderImport(SchemaFile(schema_path, doc, (), tuple(built), ()), [], reader.sources)


def _layout(call: LayoutCall, reader: _Reader, resolver: _Resolver, schema_path: str) -> Layout:
    span = Span(schema_path, 1, 1, 1, 1)
    arguments = [a for a in call.arguments if a]
    bounds = [
        (_offset(reader, call.path, a[0]), _offset(reader, call.path, a[-1]), a[-1].line)
        for a in arguments
    ]
    docs = _member_docs(reader.comments[call.path], _offset(reader, call.path, call.name), bounds)
    members: list[Member] = []
    taken: set[str] = set()
    for argument, doc_lines in zip(arguments, docs, strict=True):
        macro = argument[0]
        if macro.text in METHOD_MACROS:
            continue
        if macro.text not in MEMBER_MACROS or len(argument) < 2 or argument[1].text != "(":
            raise _error(
                "SOA603",
                f"`{_joined(argument[:1])}` in GENERATE_SOA_LAYOUT is not a member soagen knows",
                macro.span,
                "members are SOA_COLUMN, SOA_EIGEN_COLUMN and SOA_SCALAR; "
                + ", ".join(sorted(METHOD_MACROS))
                + " are skipped",
            )
        inner = list(argument[2:-1]) if argument[-1].text == ")" else list(argument[2:])
        commas = [i for i, t in enumerate(inner) if t.text == ","]
        if not commas or commas[-1] + 2 != len(inner) or inner[-1].kind != "ident":
            raise _error("SOA603", f"`{macro.text}` needs a type and a name", macro.span)
        type_tokens, name = inner[: commas[-1]], inner[-1]
        resolver.outer = _normal("".join(t.text for t in type_tokens))
        try:
            resolved = resolver.type_of(type_tokens, call.scope)
        except CmsswImportError as error:
            found = error.diagnostic
            if found.span != type_tokens[0].span:  # in an alias or a constant elsewhere
                member = Span(macro.path, macro.line, macro.column, name.line, name.column)
                found = replace(found, related=(("member", member),))
            raise CmsswImportError(found) from None
        member_kind = _member_kind(MEMBER_MACROS[macro.text], resolved, type_tokens, macro)
        soa_name, rename_note = _soa_name(name.text, taken)
        taken.add(soa_name)
        notes = [*resolved.notes, *([rename_note] if rename_note else [])]
        doc = "\n".join([*doc_lines, *notes]) or None
        members.append(
            Member(soa_name, member_kind, resolved.dtype, resolved.shape, doc, span, span)
        )
    if not members:
        raise _error("SOA603", f"layout `{call.name.text}` declares no members", call.name.span)
    align = _alignment(call, reader, resolver)
    align_statements = () if align == DEFAULT_ALIGN else ((align, span),)
    doc = _layout_doc(reader.comments[call.path], call, reader)
    return Layout(
        layout_name(call.name.text), align_statements, tuple(members), doc, span, schema_path
    )


def _member_kind(
    kind: str, resolved: _Type, type_tokens: Sequence[Token], macro: Token
) -> MemberKind:
    shown = _joined(type_tokens)
    if kind == "eigen":
        if resolved.form != "eigen":
            raise _error(
                "SOA603",
                f"SOA_EIGEN_COLUMN of `{shown}`, which is not an Eigen matrix",
                type_tokens[0].span,
            )
        return MemberKind.COLUMN
    if resolved.form == "eigen":
        raise _error(
            "SOA603",
            f"{macro.text} of the Eigen matrix `{shown}`",
            type_tokens[0].span,
            "declare Eigen members with SOA_EIGEN_COLUMN",
        )
    if kind == "scalar":
        if resolved.shape:
            raise _error(
                "SOA603",
                f"SOA_SCALAR of the array type `{shown}`: soagen scalars hold one value",
                type_tokens[0].span,
                "no soagen member takes its bytes (one padded block of the whole array); import "
                "the header's other layouts with --layout, or write this one's schema by hand "
                "without it",
            )
        return MemberKind.SCALAR
    return MemberKind.PACKED if resolved.shape else MemberKind.COLUMN


def _soa_name(name: str, taken: set[str]) -> tuple[str, str | None]:
    """The member's name in the schema: its C++ name unless soagen reserves that one."""
    if not (name.startswith("_") or is_python_keyword(name) or name in COLLECTION_ATTRIBUTES):
        return name, None
    # Not `size_`: a trailing `_` gives CMSSW's field `size__`, a name C++ reserves (SOA503), so
    # the schema would not generate a header again.
    base = f"{name.strip('_') or 'member'}_value"
    renamed, number = base, 1
    while renamed in taken:
        number += 1
        renamed = f"{base}{number}"
    return renamed, f"imported: C++ member `{name}`, renamed: soagen reserves the name `{name}`"


def _alignment(call: LayoutCall, reader: _Reader, resolver: _Resolver) -> int:
    """The alignment of the header's alias `using X = NameLayout<A>;`, CMSSW's 128 without one."""
    for target, path, arguments, scope in reader.declarations.layout_aliases:
        if target == call.name.text and path == call.path:
            first = _split(list(arguments), ",")
            if first and first[0]:
                return resolver.constant(first[0], scope)
            return DEFAULT_ALIGN
    return DEFAULT_ALIGN


def _comment_lines(comment: Comment) -> list[str]:
    text = comment.text
    if text.startswith("//"):
        # One space after the marker is the marker's; the rest is the doc's own indentation.
        return [_unspliced(text[2:].lstrip("/!<").removeprefix(" "))]
    body = text[2:-2].lstrip("*!<").split("\n")
    lines = [_unspliced(re.sub(r"^\s*\*(?!/)", "", line)) for line in body]
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return [line[indent:] for line in lines]


def _unspliced(line: str) -> str:
    """`soagen generate --lang cpp` ends a line ending in `\\` with ` //`, so that it splices
    nothing into the comment: the doc line is what comes before."""
    line = line.rstrip()
    return line.removesuffix(" //") if line.endswith("\\ //") else line


def _offset(reader: _Reader, path: str, token: Token) -> int:
    return reader.offsets[path][(token.line, token.column)]


def _member_docs(
    comments: list[Comment], begin: int, members: list[tuple[int, int, int]]
) -> list[list[str]]:
    """Each member's doc lines: the comments after the previous member (leading, or inside its
    parentheses), then its trailing ones: those after its end on the same line, with the lines
    that continue them at the same column. `members`: (start offset, end offset, end line)."""
    trailing: list[list[Comment]] = []
    for index, (_, end, end_line) in enumerate(members):
        limit = members[index + 1][0] if index + 1 < len(members) else None
        own = [
            c
            for c in comments
            if c.offset > end and c.line == end_line and (limit is None or c.offset < limit)
        ]
        for comment in comments:
            if (
                own
                and comment.offset > own[-1].offset
                and (limit is None or comment.offset < limit)
            ):
                if comment.line == own[-1].end_line + 1 and comment.column == own[0].column:
                    own.append(comment)
        trailing.append(own)
    docs: list[list[str]] = []
    after = begin
    for index, (_, end, _) in enumerate(members):
        taken = {c.offset for c in trailing[index - 1]} if index else set()
        leading = [c for c in comments if after < c.offset < end and c.offset not in taken]
        lines = [line for c in [*leading, *trailing[index]] for line in _comment_lines(c)]
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        docs.append(lines)
        after = end
    return docs


def _layout_doc(comments: list[Comment], call: LayoutCall, reader: _Reader) -> str | None:
    """The comment block that ends on the line before GENERATE_SOA_LAYOUT."""
    block: list[Comment] = []
    line = _macro_line(reader, call)
    for comment in reversed(comments):
        if comment.end_line >= line:
            continue
        if comment.end_line != line - 1:
            break
        block.insert(0, comment)
        line = comment.line
    lines = [text for comment in block for text in _comment_lines(comment)]
    text = "\n".join(lines).strip("\n")
    return text or None


def _macro_line(reader: _Reader, call: LayoutCall) -> int:
    """The line of the `GENERATE_SOA_LAYOUT` token whose first argument is `call.name`."""
    source = reader.sources[call.path].split("\n")
    for line in range(call.name.line, 0, -1):
        if "GENERATE_SOA_LAYOUT" in source[line - 1]:
            return line
    return call.name.line
