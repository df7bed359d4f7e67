"""Python source snippets already in the form `ruff format` keeps, so generated code needs no formatter.

Two rules make that hold: brackets either fit on their line or hold one item per line, several items
each with a trailing comma (ruff's "magic trailing comma" keeps them so) and a single item alone, as
ruff splits it; and strings are printed as ruff prints them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

# ruff's default, and the shortest limit a user's formatter config is likely to use.
LINE_LENGTH = 88
INDENT = "    "


def _fits(line: str) -> bool:
    """Whether `line` fits in LINE_LENGTH columns as ruff counts them (Unicode's East Asian width):
    wide and fullwidth characters take two, combining marks and Hangul's medial and final jamo none.
    Only text inside string literals (docs, paths) is not ASCII."""
    width = 0
    for char in line:
        if unicodedata.east_asian_width(char) in ("W", "F"):
            width += 2
        elif not (
            unicodedata.category(char) in ("Mn", "Me")
            or "\u1160" <= char <= "\u11ff"
            or "\ud7b0" <= char <= "\ud7ff"
        ):
            width += 1
    return width <= LINE_LENGTH


def string_literal(text: str) -> str:
    """A literal of `text` as ruff prints it, safe for any input.

    Double quotes unless the text holds more `"` than `'`: ruff picks the quote needing fewer escapes.
    """
    quote = "'" if text.count('"') > text.count("'") else '"'
    return quote + _escaped(text, quote) + quote


def _escaped(text: str, quote: str) -> str:
    body = []
    for char in text:
        if char in ("\\", quote):
            body.append("\\" + char)
        elif char.isprintable() or char == " ":
            body.append(char)
        elif char == "\n":
            body.append("\\n")
        elif char == "\t":
            body.append("\\t")
        elif ord(char) < 0x100:
            body.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            body.append(f"\\u{ord(char):04x}")
        else:
            body.append(f"\\U{ord(char):08x}")
    return "".join(body)


def comment_text(text: str) -> str:
    """`text` for a `#` comment: characters that are not printable (line breaks, other controls,
    lone surrogates from undecodable file names) are written as escapes, so the comment stays one
    line and the file stays UTF-8."""
    return "".join(c if c.isprintable() or c == " " else _escaped(c, '"') for c in text)


def assignment(target: str, value: str, indent: str) -> str:
    """`target = value` at `indent`, the value in parentheses on a line of its own if the whole
    does not fit, as ruff prints it (and keeps, at any longer line length)."""
    one_line = f"{indent}{target} = {value}"
    if _fits(one_line):
        return one_line
    return f"{indent}{target} = (\n{indent}{INDENT}{value}\n{indent})"


def docstring(text: str, indent: str) -> str:
    """A triple-quoted docstring at `indent`; quotes, backslashes and control characters are
    escaped.

    ruff strips the blanks a docstring's first line starts with, and the indentation all its later
    lines share beyond `indent`; one such blank written as `\\x20` is text to ruff, so the docstring
    keeps the text exactly and ruff keeps the docstring.
    """
    lines = []
    # Only \n ends a line: other separators (\x0c, \u2028, ...) are kept, escaped.
    for line in text.split("\n"):
        escaped = _escaped(line.rstrip(), '"')
        lines.append(escaped)
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        lines = [""]
    escape_at = [0]
    later = [number for number, line in enumerate(lines) if number and line]
    if later and all(lines[number].startswith(" ") for number in later):
        escape_at.append(later[0])
    for number in escape_at:
        if lines[number].startswith(" "):
            lines[number] = "\\x20" + lines[number][1:]
    if len(lines) == 1:
        return f'{indent}"""{lines[0]}"""'
    body = "\n".join(f"{indent}{line}" if line else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}\n{body}\n{indent}"""'


@dataclass(frozen=True, slots=True)
class Call:
    """`function(arguments...)`, arguments being source text or nested expressions."""

    function: str
    arguments: tuple[Expression, ...]


@dataclass(frozen=True, slots=True)
class Subscript:
    """`value[indices...]`: `out[0]`, `Nodes.BLOCKS["x"]`, `tuple[A, B]`."""

    value: str
    indices: tuple[Expression, ...]


@dataclass(frozen=True, slots=True)
class TupleLiteral:
    items: tuple[Expression, ...]


@dataclass(frozen=True, slots=True)
class Parenthesized:
    """An expression written bare where it fits, else inside parentheses on a line of its own: for a
    sum as a dict value, which ruff would otherwise break before every operator, and which it keeps
    in parentheses once they are written."""

    expression: Expression


Expression = str | Call | Subscript | TupleLiteral | Parenthesized


def _brackets(
    expression: Call | Subscript | TupleLiteral | Parenthesized,
) -> tuple[str, tuple[Expression, ...], str]:
    """The opening text, the items and the closing bracket of a bracketed expression."""
    if isinstance(expression, Call):
        return f"{expression.function}(", expression.arguments, ")"
    if isinstance(expression, Subscript):
        return f"{expression.value}[", expression.indices, "]"
    if isinstance(expression, TupleLiteral):
        return "(", expression.items, ")"
    return "(", (expression.expression,), ")"


def flat(expression: Expression) -> str:
    if isinstance(expression, str):
        return expression
    if isinstance(expression, Parenthesized):
        return flat(expression.expression)
    opening, items, closing = _brackets(expression)
    one_tuple = isinstance(expression, TupleLiteral) and len(items) == 1
    return opening + ", ".join(flat(item) for item in items) + ("," if one_tuple else "") + closing


def tuple_literal(items: Sequence[Expression]) -> TupleLiteral:
    return TupleLiteral(tuple(items))


def render(expression: Expression, indent: str, prefix: str = "", suffix: str = "") -> str:
    """`indent + prefix + expression + suffix`, on one line if it fits, else as ruff splits it: the
    outermost brackets' items on lines of their own, recursively. Several items (or a one-tuple's)
    each end with a comma, which keeps ruff from joining them again at any line length; one item
    stands alone without one, as ruff writes a call or subscript of one argument."""
    one_line = f"{indent}{prefix}{flat(expression)}{suffix}"
    if _fits(one_line) or isinstance(expression, str):
        return one_line
    opening, items, closing = _brackets(expression)
    if not items:
        return one_line
    comma = "," if len(items) > 1 or isinstance(expression, TupleLiteral) else ""
    lines = [f"{indent}{prefix}{opening}"]
    lines += [render(item, indent + INDENT, suffix=comma) for item in items]
    return "\n".join(lines) + f"\n{indent}{closing}{suffix}"


def class_header(name: str, base: str) -> str:
    """`class name(base):`, the base on a line of its own where that does not fit."""
    return render(Call(f"class {name}", (base,)), "", suffix=":")


def function_header(name: str, parameters: Sequence[str], returns: str, indent: str) -> str:
    """`def name(parameters) -> returns:` at `indent`; where that does not fit, one parameter per
    line, each with a trailing comma, as ruff splits parameters (even a single one)."""
    one_line = f"{indent}def {name}({', '.join(parameters)}) -> {returns}:"
    if _fits(one_line):
        return one_line
    lines = [f"{indent}def {name}(", *(f"{indent}{INDENT}{parameter}," for parameter in parameters)]
    return "\n".join(lines) + f"\n{indent}) -> {returns}:"


def import_from(module: str, names: Sequence[str]) -> str:
    one_line = f"from {module} import {', '.join(names)}"
    if _fits(one_line):
        return one_line
    return f"from {module} import (\n" + "".join(f"{INDENT}{name},\n" for name in names) + ")"
