"""`soagen fmt`: canonical, idempotent, every comment kept, meaning unchanged; -w, --check, --diff."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soagen.dsl.parser import _lark, parse
from soagen.tools.fmt import FormatBug, _Printer, format_source
from tests.helpers import REPO, run_cli

CORPUS = sorted(
    p
    for folder in ("schemas", "tests/golden", "examples")
    if (REPO / folder).is_dir()
    for p in (REPO / folder).rglob("*.soa")
)

MESSY = """//!   Module doc
//!second line
import "a.soa"   // why this import
import "b.soa"
// standalone note

/// Nodes doc
///no space after the marker
layout Nodes { column float32 x,y , z   // coords
  column int32 id
  align +0128


  // before cov
  column float32[ 3,3 ] cov , cov2
  scalar float32 bfield # field
}
model M {
  input a=Nodes{x,y,z} as [n,c]
  /// doc of b
  input  bee_long = Nodes{id}
  output out = Nodes{cov, // inside the block
       cov2} as [n, c, 3, 3]
  output o = Nodes { cov } as [ n , 3 , 3 ]   // trailing
  // before the close
}   // end
// end of file
"""

MESSY_FORMATTED = """//!   Module doc
//! second line

import "a.soa"  // why this import
import "b.soa"
// standalone note

/// Nodes doc
/// no space after the marker
layout Nodes {
    align 128
    column float32 x, y, z  // coords
    column int32 id

    // before cov
    column float32[3, 3] cov, cov2
    scalar float32 bfield  # field
}

model M {
    input  a        = Nodes{x, y, z} as [n, c]
    /// doc of b
    input  bee_long = Nodes{id}
    output out = Nodes{cov,  // inside the block
            cov2} as [n, c, 3, 3]
    output o        = Nodes{cov}     as [n, 3, 3]  // trailing
    // before the close
}  // end

// end of file
"""


def _is_span(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {
        "path",
        "line",
        "column",
        "end_line",
        "end_column",
    }


def _meaning(value: object) -> object:
    """The IR as plain data with every span dropped: written independently of soagen.tools.fmt."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _meaning(v) for k, v in value.items() if not _is_span(v)}
    if isinstance(value, list | tuple):
        return [_meaning(v) for v in value if not _is_span(v)]
    return value


def _ir(text: str) -> object:
    schema_file, problems = parse(text, "x.soa")
    assert schema_file is not None, problems
    return _meaning(schema_file)


def _comments(text: str) -> list[str]:
    return [
        str(t).rstrip()
        for t in _lark().lex(text, dont_ignore=True)
        if t.type in ("COMMENT", "DOC_COMMENT", "MODULE_DOC")
    ]


def _fmt(text: str) -> str:
    formatted, problems = format_source(text, "x.soa")
    assert formatted is not None, problems
    return formatted


def test_messy_schema_gets_the_canonical_style() -> None:
    assert _fmt(MESSY) == MESSY_FORMATTED


def test_messy_schema_keeps_meaning_and_comments() -> None:
    formatted = _fmt(MESSY)
    assert _ir(formatted) == _ir(MESSY)
    # Every plain comment survives verbatim; docs only gain the space after `///`.
    plain = [c for c in _comments(MESSY) if not c.startswith(("///", "//!"))]
    assert [c for c in _comments(formatted) if not c.startswith(("///", "//!"))] == plain
    assert len(_comments(formatted)) == len(_comments(MESSY))


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "schemas").glob("*.soa"))
    + sorted((REPO / "benchmarks" / "schemas").glob("*.soa")),
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_shipped_schemas_are_formatted(path: Path) -> None:
    # Whoever adopts the soagen-fmt pre-commit hook must not see the examples rewritten.
    assert _fmt(path.read_text()) == path.read_text()


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_corpus_idempotent_and_same_ir(path: Path) -> None:
    text = path.read_text()
    once = _fmt(text)
    assert _fmt(once) == once
    assert _ir(once) == _ir(text)
    assert sorted(_comments(once)) == sorted(
        c if not c.startswith(("///", "//!")) or c[3:4] in ("", " ") else f"{c[:3]} {c[3:]}"
        for c in _comments(text)
    )


def test_align_moves_first_with_its_comments() -> None:
    text = "layout A {\n    column float32 x\n    // the cache line\n    align 64  // GPU\n}\n"
    assert _fmt(text) == (
        "layout A {\n    // the cache line\n    align 64  // GPU\n    column float32 x\n}\n"
    )


def test_one_line_schema_is_spread_out() -> None:
    text = (
        'import "c.soa" layout A { align 64 column float32 x, y } '
        "model M { input i = A{x, y} output o = A{x} as [n] }"
    )
    assert _fmt(text) == (
        'import "c.soa"\n\nlayout A {\n    align 64\n    column float32 x, y\n}\n\n'
        "model M {\n    input  i = A{x, y}\n    output o = A{x} as [n]\n}\n"
    )


def test_binding_clauses_in_canonical_spacing() -> None:
    text = (
        "layout N { column float32 x, y }\nlayout K { column bool k }\nmodel M {\n"
        "  input p=N{x}   as [ n ]   whole   contiguous\n"
        "  input k = K{k}same   n  as\n p  whole // tied\n"
        "  input j = K{k} same n // inside\n   as p\n"
        "  output y = N{y}\n}\n"
    )
    formatted = _fmt(text)
    assert formatted.split("model M {\n")[1] == (
        "    input  p = N{x} as [n] whole contiguous\n"
        "    input  k = K{k} same n as p whole  // tied\n"
        "    input j = K{k} same n  // inside\n"
        "            as p\n"
        "    output y = N{y}\n}\n"
    )
    assert _fmt(formatted) == formatted
    assert _ir(formatted) == _ir(text)


def test_empty_and_comment_only_files() -> None:
    assert _fmt("") == ""
    assert _fmt("\n\n  \n") == ""
    assert _fmt("// only\n\n\n# two\n") == "// only\n\n# two\n"


def test_bom_crlf_and_keywords_as_names() -> None:
    text = "\ufefflayout A {\r\n  scalar int32 as\r\n  column float32 layout\r\n}\r\n"
    assert _fmt(text.replace("\r\n", "\n")) == (
        "layout A {\n    scalar int32 as\n    column float32 layout\n}\n"
    )


def test_syntax_error_is_reported_not_formatted() -> None:
    formatted, problems = format_source("layout A {\n    column float32\n}\n", "bad.soa")
    assert formatted is None
    assert [(d.code, d.span.line, d.span.column) for d in problems] == [("SOA001", 3, 1)]


# Separators that whitespace may be replaced by anywhere: spaces, lines, blank lines, comments.
SEPARATORS = st.sampled_from([" ", "  ", "\t", "\n", "\n\n", "\n\n\n", " // c\n", "\n# k\n\n"])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(CORPUS), st.data())
def test_any_spacing_and_comments_format_to_a_fixed_point(path: Path, data: st.DataObject) -> None:
    """Re-space a schema at random (comments included) and format: same IR, idempotent."""
    tokens = [t for t in _lark().lex(path.read_text(), dont_ignore=True) if t.type != "WS"]
    pieces = []
    for token in tokens:
        pieces.append(str(token))
        separator = data.draw(SEPARATORS)
        # A comment runs to the end of its line: what follows must start on the next one.
        if token.type in ("COMMENT", "DOC_COMMENT", "MODULE_DOC") and not separator.startswith(
            "\n"
        ):
            separator = "\n" + separator
        pieces.append(separator)
    text = "".join(pieces)
    once = _fmt(text)
    assert _fmt(once) == once
    assert _ir(once) == _ir(text) == _ir(path.read_text())
    assert len(_comments(once)) == len(_comments(text))


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    previous = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(previous)


def test_cli_check_diff_write(in_tmp: Path) -> None:
    (in_tmp / "schemas").mkdir()
    messy = in_tmp / "schemas" / "messy.soa"
    messy.write_text(MESSY)
    clean = in_tmp / "schemas" / "clean.soa"
    clean.write_text(MESSY_FORMATTED)

    status, out, err = run_cli("fmt", "--check", "schemas")
    assert status == 1 and out == ""
    assert "would reformat schemas/messy.soa" in err and "clean.soa" not in err
    assert messy.read_text() == MESSY  # --check changes nothing

    status, out, _ = run_cli("fmt", "--diff", "schemas/messy.soa")
    assert status == 1
    assert "--- schemas/messy.soa (original)" in out and "+++ schemas/messy.soa (formatted)" in out
    assert "-layout Nodes { column float32 x,y , z   // coords\n" in out
    assert "+    column float32 x, y, z  // coords\n" in out

    status, out, err = run_cli("fmt", "schemas/messy.soa")  # no flag: print, change nothing
    assert status == 0 and out == MESSY_FORMATTED and messy.read_text() == MESSY

    status, _, err = run_cli("fmt", "-w", "schemas")
    assert status == 0 and "formatted schemas/messy.soa" in err and "clean.soa" not in err
    assert messy.read_text() == MESSY_FORMATTED
    mtime = clean.stat().st_mtime_ns
    assert run_cli("fmt", "--check", "schemas")[0] == 0
    assert run_cli("fmt", "-w", "schemas")[0] == 0
    assert clean.stat().st_mtime_ns == mtime  # formatted files are not rewritten


def test_printer_losing_a_comment_is_refused_and_nothing_is_written(
    in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A printer bug: every standalone comment is dropped. The check must refuse the result.
    monkeypatch.setattr(_Printer, "comments", lambda self, comments, indent, top: None)
    with pytest.raises(FormatBug, match=r"^lossy\.soa: formatting would change the schema"):
        format_source(MESSY, "lossy.soa")

    lossy = in_tmp / "lossy.soa"
    lossy.write_bytes(MESSY.encode())
    ugly = in_tmp / "ugly.soa"
    ugly.write_text("layout A{column float32 x}")  # no comment: the bug does not touch it
    status, out, err = run_cli("fmt", "-w", "lossy.soa", "ugly.soa")
    assert status == 1, err
    assert "soagen: internal error: lossy.soa: formatting would change the schema" in err
    assert "formatted ugly.soa" in err and "formatted lossy.soa" not in err
    assert lossy.read_bytes() == MESSY.encode()  # byte-identical: the refused text is not written
    assert ugly.read_text() == "layout A {\n    column float32 x\n}\n"


def test_cli_syntax_error_names_the_place(in_tmp: Path) -> None:
    (in_tmp / "bad.soa").write_text("layout A {\n    column float32 x y,\n}\n")
    status, out, err = run_cli("fmt", "--check", "bad.soa", "--color", "never")
    assert status == 1
    assert "bad.soa:2:22: error[SOA001]: unexpected `y`" in err
    assert (in_tmp / "bad.soa").read_text() == "layout A {\n    column float32 x y,\n}\n"
    assert run_cli("fmt", "--check", "missing.soa")[0] == 2
    assert run_cli("fmt", "-w", "--check", "bad.soa")[0] == 2


def test_cli_stdin_to_stdout() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "soagen", "fmt", "-"],
        input="layout A{column float32 x}",
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "layout A {\n    column float32 x\n}\n"
    for text, expected in (("layout A {\n    column float32 x\n}\n", 0), ("layout A{}", 1)):
        check = subprocess.run(
            [sys.executable, "-m", "soagen", "fmt", "--check", "-"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == expected, text
        assert check.stdout == ""


def test_cli_json_is_one_document_in_every_mode(in_tmp: Path) -> None:
    import json

    (in_tmp / "bad.soa").write_text("layout A {\n    colum float32 x\n}\n")
    (in_tmp / "ugly.soa").write_text("layout A{column float32 x}")
    status, out, _ = run_cli("fmt", "bad.soa", "ugly.soa", "--format", "json")
    document = json.loads(out)
    assert status == 1
    assert [(f["path"], f["error"]) for f in document["files"]] == [
        ("bad.soa", True),
        ("ugly.soa", False),
    ]
    assert document["files"][1]["formatted"] == "layout A {\n    column float32 x\n}\n"
    assert [(d["path"], d["line"], d["code"]) for d in document["diagnostics"]] == [
        ("bad.soa", 2, "SOA001")
    ]
    status, out, _ = run_cli("fmt", "--diff", "ugly.soa", "--format", "json")
    (entry,) = json.loads(out)["files"]
    assert status == 1 and entry["changed"] and "+    column float32 x" in entry["diff"]
    for stdin_args, key in ((["-"], "formatted"), (["--check", "-"], None)):
        done = subprocess.run(
            [sys.executable, "-m", "soagen", "fmt", *stdin_args, "--format", "json"],
            input="layout A{column float32 x}",
            capture_output=True,
            text=True,
            check=False,
        )
        (entry,) = json.loads(done.stdout)["files"]
        assert entry["path"] == "<stdin>" and entry["changed"]
        assert (key in entry) if key else set(entry) == {"path", "changed", "error"}
