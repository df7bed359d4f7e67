"""The one registry of codes (`soagen.dsl.codes`) against everything that emits or shows them: the
schema checks, the lint checks, the breaking-change comparer and README's tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from soagen.dsl.codes import (
    BREAKING,
    CATEGORIES,
    ERROR,
    KINDS,
    LINT,
    REGISTRY,
    Kind,
    lookup,
    markdown_table,
    of_kind,
)
from soagen.dsl.loader import load
from soagen.tools import breaking, lint
from soagen.tools.config import Config
from tests.helpers import REPO

SOAGEN = REPO / "soagen"
ERROR_CATEGORY_BY_HUNDRED = {
    "1": "names",
    "2": "layout",
    "3": "binding",
    "4": "imports",
    "5": "cpp",
    "6": "cmssw",
}


def test_every_code_is_well_formed() -> None:
    assert [code.kind for code in REGISTRY.values()] == sorted(
        (code.kind for code in REGISTRY.values()), key=KINDS.index
    ), "the registry lists errors, then lint rules, then breaking rules"
    for code in REGISTRY.values():
        assert code.kind in KINDS and code.category in CATEGORIES[code.kind], code.id
        pattern = r"SOA\d{3}" if code.kind == ERROR else r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+"
        assert re.fullmatch(pattern, code.id), code.id
        assert code.purpose and "\n" not in code.purpose and not code.purpose.endswith("."), code.id
        text = code.text()
        assert code.explanation and text == text.strip() and "\n\n\n" not in text, code.id
        assert max(len(line) for line in text.splitlines()) <= 92, code.id
        assert len(code.explanation.splitlines()) <= 12, code.id
        assert lookup(code.id.lower()) is code
    assert lookup("NO_SUCH_CODE") is None


def test_schema_error_categories_follow_the_numbers() -> None:
    for code in of_kind(ERROR):
        expected = ERROR_CATEGORY_BY_HUNDRED.get(code.id[3])
        if code.id[3] == "0":
            expected = "syntax" if code.id == "SOA001" else "files"
        assert code.category == expected, code.id


def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_every_emitted_schema_error_is_registered_and_every_registered_one_is_emitted() -> None:
    """The SOA codes written in soagen's sources (outside the registry) are those it registers."""
    emitted: set[str] = set()
    for path in SOAGEN.rglob("*.py"):
        if path != SOAGEN / "dsl" / "codes.py":
            emitted |= set(re.findall(r"""["'](SOA\d{3})["']""", _source(path)))
    assert emitted == {code.id for code in of_kind(ERROR)}


def test_every_lint_check_has_a_code_and_every_lint_code_a_check() -> None:
    assert set(lint.CHECKS) == {code.id for code in of_kind(LINT)}
    assert [rule.code for rule in lint.RULES] == list(of_kind(LINT))
    assert lint.CATEGORIES == CATEGORIES[LINT]


def test_every_breaking_report_has_a_code_and_every_breaking_code_is_reported() -> None:
    reported = set(
        re.findall(r'self\.report\(\s*"([A-Z_]+)"', _source(SOAGEN / "tools" / "breaking.py"))
    )
    assert reported == {code.id for code in of_kind(BREAKING)}
    assert breaking.LEVELS == {code.id: code.category for code in of_kind(BREAKING)}


LINT_EXAMPLES = [
    (code.id, gives, schema)
    for code in of_kind(LINT)
    for example in code.examples
    for gives, schema in ((True, example.bad), (False, example.fixed))
    if schema is not None
]


def test_every_lint_rule_has_an_example() -> None:
    assert {code for code, gives, _ in LINT_EXAMPLES if gives} == {c.id for c in of_kind(LINT)}


@pytest.mark.parametrize(
    ("rule", "gives", "schema"),
    LINT_EXAMPLES,
    ids=[f"{rule}-{'gives' if gives else 'fixed'}" for rule, gives, _ in LINT_EXAMPLES],
)
def test_lint_examples(tmp_path: Path, rule: str, gives: bool, schema: str) -> None:
    """A rule's bad example is a valid schema the rule reports; its fixed one, one it passes."""
    path = tmp_path / "example.soa"
    path.write_text(schema + "\n")
    assert load(path).diagnostics == []
    report = lint.lint([path], select=[rule], config=Config(None))
    assert report.schema_errors == 0
    assert bool(report.diagnostics) == gives, report.diagnostics
    assert {d.code for d in report.diagnostics} <= {rule}


def _readme_table(head: str) -> str:
    """The README table whose first line is `head`, up to its first line that is not a row."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert lines.count(head) == 1, f"README has {lines.count(head)} tables headed {head!r}"
    start = lines.index(head)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("kind", KINDS)
def test_readme_tables_match_the_registry(kind: Kind) -> None:
    expected = markdown_table(kind)
    assert _readme_table(expected.splitlines()[0]) == expected, (
        f"README's table of {kind} codes differs from the registry; it should read:\n{expected}"
    )
