"""Python source snippets already in the form `ruff format` keeps, so generated code needs no formatter.

Two rules make that hold: a call or collection either fits on its line or is written one item per line
with a trailing comma (ruff's "magic trailing comma" keeps it so), and strings are printed as ruff prints
them: double quotes, no needless escapes.
"""

from __future__ import annotations

from collections.abc import Sequence

# ruff's default, and the shortest limit a user's formatter config is likely to use.
LINE_LENGTH = 88
INDENT = "    "


def string_literal(text: str) -> str:
    """A double-quoted literal of `text`: identical to what ruff prints, and safe for any input."""
    body = []
    for char in text:
        if char in '\\"':
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
    return '"' + "".join(body) + '"'


def docstring(text: str, indent: str) -> str:
    """A triple-quoted docstring at `indent`; quotes, backslashes and control characters are escaped."""
    lines = []
    for line in text.splitlines():
        escaped = string_literal(line.rstrip())[1:-1]
        lines.append(escaped)
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        lines = [""]
    if len(lines) == 1:
        return f'{indent}"""{lines[0]}"""'
    body = "\n".join(f"{indent}{line}" if line else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}\n{body}\n{indent}"""'


def tuple_literal(items: Sequence[str]) -> str:
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def call(head: str, arguments: Sequence[str], indent: str, tail: str = "") -> str:
    """`head(arg, ...)tail` on one line if it fits at `indent`, else one argument per line."""
    one_line = f"{indent}{head}({', '.join(arguments)}){tail}"
    if len(one_line) <= LINE_LENGTH:
        return one_line
    inner = indent + INDENT
    lines = [f"{indent}{head}("] + [f"{inner}{argument}," for argument in arguments]
    return "\n".join(lines) + f"\n{indent}){tail}"
