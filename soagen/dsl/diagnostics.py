"""Problems found in schemas, as structured data with coordinates.

Every check returns `Diagnostic`s rather than raising, so one run reports all of them together. Every
code (its purpose, explanation and examples) is registered in `soagen.dsl.codes`, which
`soagen explain` prints.
"""

from __future__ import annotations

import difflib
import json
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Span:
    """Where something is in a schema file: 1-based line and column, end exclusive."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    message: str
    span: Span
    hint: str | None = None
    severity: str = "error"
    # Other places the message refers to (the first declaration of a duplicate, say).
    related: tuple[tuple[str, Span], ...] = field(default=())

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.span.path, self.span.line, self.span.column, self.code)


class SchemaError(Exception):
    """Raised by the loading API when a schema has errors; carries all of them."""

    def __init__(self, diagnostics: list[Diagnostic], sources: Mapping[str, str]) -> None:
        self.diagnostics = sorted(diagnostics, key=Diagnostic.sort_key)
        self.sources = dict(sources)
        super().__init__(render_text(self.diagnostics, self.sources, color=False))


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A hint naming the closest choice; among equally close ones the first, so `flot` suggests
    `float32`."""
    best, best_score = None, 0.0
    for choice in choices:
        score = difflib.SequenceMatcher(None, word, choice).ratio()
        if score >= 0.6 and score > best_score:
            best, best_score = choice, score
    return f"did you mean `{best}`?" if best is not None else None


def source_lines(text: str) -> list[str]:
    """The lines of a schema as the parser numbers them: split at newlines only (not at form feeds
    or U+2028 as `str.splitlines` would), without the carriage return of CRLF files."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _shown(source_line: str) -> str:
    """A source line safe to print: each control or invisible character becomes one U+FFFD, so the
    terminal shows the line as it is and every column keeps its place."""
    return "".join(ch if ch in "\t " or ch.isprintable() else "\ufffd" for ch in source_line)


def _padding(ch: str) -> str:
    """What goes under one character so the caret lines up: tabs stay tabs, wide characters take
    two cells, combining marks none."""
    if ch == "\t":
        return ch
    if unicodedata.combining(ch):
        return ""
    return "  " if unicodedata.east_asian_width(ch) in ("W", "F") else " "


def _caret_line(source_line: str, span: Span) -> str:
    end = span.end_column if span.end_line == span.line else span.column + 1
    under = source_line[span.column - 1 : max(end, span.column + 1) - 1]
    width = max(1, sum(len(_padding(ch).replace("\t", " ")) for ch in under))
    prefix = "".join(_padding(ch) for ch in source_line[: span.column - 1])
    return prefix + "^" * width


def render_one(diagnostic: Diagnostic, sources: Mapping[str, str], color: bool = False) -> str:
    span = diagnostic.span
    bold, red, blue, reset = ("\x1b[1m", "\x1b[31m", "\x1b[34m", "\x1b[0m") if color else ("",) * 4
    head = (
        f"{bold}{span.path}:{span.line}:{span.column}: {red}{diagnostic.severity}"
        f"[{diagnostic.code}]{reset}{bold}: {diagnostic.message}{reset}"
    )
    lines = [head]
    text = sources.get(span.path)
    if text is not None:
        lines_of_text = source_lines(text)
        if 1 <= span.line <= len(lines_of_text):
            source_line = _shown(lines_of_text[span.line - 1])
            gutter = f"{span.line} | "
            lines.append(f"{blue}{gutter}{reset}{source_line}")
            lines.append(" " * len(gutter) + f"{red}{_caret_line(source_line, span)}{reset}")
    for note, where in diagnostic.related:
        lines.append(f"  note: {note} at {where.path}:{where.line}:{where.column}")
    if diagnostic.hint:
        lines.append(f"  hint: {diagnostic.hint}")
    return "\n".join(lines)


def render_text(
    diagnostics: Iterable[Diagnostic], sources: Mapping[str, str], color: bool = False
) -> str:
    return "\n".join(render_one(d, sources, color) for d in diagnostics)


def to_json_object(diagnostic: Diagnostic) -> dict[str, object]:
    span = diagnostic.span
    return {
        "code": diagnostic.code,
        "severity": diagnostic.severity,
        "message": diagnostic.message,
        "hint": diagnostic.hint,
        "path": span.path,
        "line": span.line,
        "column": span.column,
        "end_line": span.end_line,
        "end_column": span.end_column,
        "related": [
            {"message": note, "path": where.path, "line": where.line, "column": where.column}
            for note, where in diagnostic.related
        ],
    }


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    return json.dumps({"diagnostics": [to_json_object(d) for d in diagnostics]}, indent=2)


def _github_escape(text: str, property_value: bool = False) -> str:
    """GitHub workflow commands' escaping: `%`, CR and LF always; `:` and `,` in properties."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def _from_root(path: str, root: str | None) -> str:
    if not root:
        return path
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except (ValueError, OSError):
        return path


def render_github(diagnostics: Iterable[Diagnostic], root: str | None = None) -> str:
    """One workflow annotation per diagnostic (`::error file=...,line=...,col=...::message`).
    GitHub places annotations by path from the repository's root: with `root` (the workflow's
    `GITHUB_WORKSPACE`), paths under it are given from there, whatever the working folder."""
    lines = []
    for diagnostic in diagnostics:
        span = diagnostic.span
        level = "warning" if diagnostic.severity == "warning" else "error"
        properties = ",".join(
            f"{key}={_github_escape(str(value), property_value=True)}"
            for key, value in (
                ("file", _from_root(span.path, root)),
                ("line", span.line),
                ("col", span.column),
                ("endLine", span.end_line),
                ("endColumn", span.end_column),
                ("title", f"soagen {diagnostic.code}"),
            )
        )
        message = diagnostic.message + (f" ({diagnostic.hint})" if diagnostic.hint else "")
        lines.append(f"::{level} {properties}::{_github_escape(message)}")
    return "\n".join(lines)
