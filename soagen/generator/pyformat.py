"""Python source snippets already in the form `ruff format` keeps, so generated code needs no formatter.

Two rules make that hold: a call either fits on its line or is written one argument per line with a
trailing comma (ruff's "magic trailing comma" keeps it so), and strings are printed as ruff prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# ruff's default, and the shortest limit a user's formatter config is likely to use.
LINE_LENGTH = 88
INDENT = "    "


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
    if len(one_line) <= LINE_LENGTH:
        return one_line
    return f"{indent}{target} = (\n{indent}{INDENT}{value}\n{indent})"


def docstring(text: str, indent: str) -> str:
    """A triple-quoted docstring at `indent`; quotes, backslashes and control characters are escaped."""
    lines = []
    # Only \n ends a line: other separators (\x0c, \u2028, ...) are kept, escaped.
    for line in text.split("\n"):
        escaped = _escaped(line.rstrip(), '"')
        lines.append(escaped)
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        lines = [""]
    if len(lines) == 1:
        return f'{indent}"""{lines[0]}"""'
    body = "\n".join(f"{indent}{line}" if line else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}\n{body}\n{indent}"""'


@dataclass(frozen=True, slots=True)
class Call:
    """`function(arguments...)`, arguments being source text or nested calls."""

    function: str
    arguments: tuple[Expression, ...]


Expression = str | Call


def flat(expression: Expression) -> str:
    if isinstance(expression, str):
        return expression
    return f"{expression.function}({', '.join(flat(a) for a in expression.arguments)})"


def tuple_literal(items: Sequence[str]) -> str:
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def render(expression: Expression, indent: str, prefix: str = "", suffix: str = "") -> str:
    """`indent + prefix + expression + suffix`, on one line if it fits, else as ruff splits it:
    the outermost call's arguments one per line with a trailing comma, recursively."""
    one_line = f"{indent}{prefix}{flat(expression)}{suffix}"
    if len(one_line) <= LINE_LENGTH or isinstance(expression, str):
        return one_line
    inner = indent + INDENT
    lines = [f"{indent}{prefix}{expression.function}("]
    lines += [render(argument, inner, suffix=",") for argument in expression.arguments]
    return "\n".join(lines) + f"\n{indent}){suffix}"


def import_from(module: str, names: Sequence[str]) -> str:
    one_line = f"from {module} import {', '.join(names)}"
    if len(one_line) <= LINE_LENGTH:
        return one_line
    return f"from {module} import (\n" + "".join(f"{INDENT}{name},\n" for name in names) + ")"
