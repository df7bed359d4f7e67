"""`soagen lint`: every rule at its exact place, selection and pyproject config, formats, exit codes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from soagen.dsl.codes import LINT, of_kind
from soagen.tools.lint import RULES, RULES_BY_ID, to_pascal_case, to_snake_case
from tests.helpers import REPO, run_cli

# A schema no rule objects to (the rule cases below each break exactly one rule).
CLEAN = """//! Clean.

/// Hits of a tracker.
layout Hits {
    align 128
    column float32 x, y, z
    column int32 detector_id
    scalar float32 bfield
}

/// Finds tracks.
model TrackFinder {
    input  positions = Hits{x, y, z} as [n, c]
    output ids       = Hits{detector_id}
}
"""

# rule -> (schema with exactly that problem, (line, column) of the finding)
CASES: dict[str, tuple[str, tuple[int, int]]] = {
    "SCALAR_BETWEEN_COLUMNS": (
        CLEAN.replace(
            "    column float32 x, y, z\n",
            "    column float32 x, y\n    scalar int64 run\n    column float32 z\n",
        ).replace("Hits{x, y, z} as [n, c]", "Hits{x, y} as [n, c]"),
        (7, 18),
    ),
    "COLUMNS_GROUPED_BY_TYPE": (
        CLEAN.replace(
            "    column int32 detector_id\n", "    column int32 detector_id\n    column float32 t\n"
        ),
        (8, 20),
    ),
    "ALIGN_CACHE_LINE": (CLEAN.replace("align 128", "align 64"), (5, 11)),
    "LAYOUT_PASCAL_CASE": (CLEAN.replace("Hits", "tracker_hits"), (4, 8)),
    "MODEL_PASCAL_CASE": (CLEAN.replace("TrackFinder", "Track_Finder"), (12, 7)),
    "MEMBER_SNAKE_CASE": (CLEAN.replace("detector_id", "detectorId"), (7, 18)),
    "BINDING_SNAKE_CASE": (CLEAN.replace("positions", "Positions"), (13, 12)),
    "LAYOUT_DOC_COMMENT": (CLEAN.replace("/// Hits of a tracker.\n", ""), (3, 8)),
    "MODEL_DOC_COMMENT": (CLEAN.replace("/// Finds tracks.\n", ""), (11, 7)),
    "INTEGER_INPUT_INDEXES": (
        CLEAN.replace(
            "    output ids",
            "    input  detectors = Hits{detector_id}\n    output ids",
        ),
        (14, 12),
    ),
    "LAYOUT_UNUSED": (
        CLEAN.replace("/// Finds", "/// Spare.\nlayout Spare {\n    column int8 s\n}\n\n/// Finds"),
        (12, 8),
    ),
}


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    previous = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(previous)


def _lint_json(*args: str) -> tuple[int, list[dict[str, object]]]:
    status, out, err = run_cli("lint", *args, "--format", "json")
    assert out, err
    return status, json.loads(out)["diagnostics"]


def test_every_rule_has_a_case() -> None:
    assert set(CASES) == set(RULES_BY_ID)
    assert len(RULES_BY_ID) == len(RULES)
    assert {rule.category for rule in RULES} == {"MINIMAL", "BASIC", "STANDARD"}


def test_clean_schema_passes(in_tmp: Path) -> None:
    (in_tmp / "clean.soa").write_text(CLEAN)
    status, out, _ = run_cli("lint", "clean.soa")
    assert status == 0 and "1 file checked: no findings" in out


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_at_its_place(in_tmp: Path, rule: str) -> None:
    text, (line, column) = CASES[rule]
    (in_tmp / "case.soa").write_text(text)
    status, diagnostics = _lint_json("case.soa")
    assert status == 1
    assert [(d["code"], d["path"], d["line"], d["column"]) for d in diagnostics] == [
        (rule, "case.soa", line, column)
    ]
    assert diagnostics[0]["hint"]
    # Ignoring the rule (by ID or by its whole category) makes the file clean.
    assert run_cli("lint", "case.soa", "--ignore", rule)[0] == 0
    assert run_cli("lint", "case.soa", "--ignore", RULES_BY_ID[rule].category.lower())[0] == 0


def test_text_output_points_at_the_name(in_tmp: Path) -> None:
    (in_tmp / "case.soa").write_text(CASES["LAYOUT_PASCAL_CASE"][0])
    status, out, _ = run_cli("lint", "case.soa", "--color", "never")
    assert status == 1
    assert "case.soa:4:8: error[LAYOUT_PASCAL_CASE]: layout `tracker_hits` is not PascalCase" in out
    assert "4 | layout tracker_hits {\n           ^^^^^^^^^^^^" in out
    assert "hint: rename it `TrackerHits`" in out
    assert out.rstrip().endswith("1 finding in 1 file")


def test_github_annotations(in_tmp: Path) -> None:
    (in_tmp / "case.soa").write_text(CASES["MEMBER_SNAKE_CASE"][0])
    status, out, _ = run_cli("lint", "case.soa", "--format", "github")
    assert status == 1
    assert out.splitlines() == [
        "::error file=case.soa,line=7,col=18,endLine=7,endColumn=28,"
        "title=soagen MEMBER_SNAKE_CASE::column `Hits.detectorId` is not snake_case "
        "(rename it `detector_id`)"
    ]


def test_github_annotations_give_paths_from_the_workspace(
    in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow step with `working-directory: schemas` still annotates schemas/case.soa."""
    (in_tmp / "schemas").mkdir()
    (in_tmp / "schemas" / "case.soa").write_text(CASES["MEMBER_SNAKE_CASE"][0])
    monkeypatch.setenv("GITHUB_WORKSPACE", str(in_tmp))
    os.chdir(in_tmp / "schemas")
    out = run_cli("lint", "case.soa", "--format", "github")[1]
    assert out.startswith("::error file=schemas/case.soa,line=7,col=18,"), out
    (in_tmp / "schemas" / "bad.soa").write_text("layout A {\n")  # a schema error, not a finding
    out = run_cli("lint", "bad.soa", "--format", "github")[1]
    assert out.startswith("::error file=schemas/bad.soa,"), out


def test_categories_nest(in_tmp: Path) -> None:
    text = CLEAN.replace("/// Hits of a tracker.\n", "").replace("Hits", "tracker_hits")
    (in_tmp / "case.soa").write_text(text)
    codes = {
        select: sorted(str(d["code"]) for d in _lint_json("case.soa", "--select", select)[1])
        for select in ("MINIMAL", "BASIC", "STANDARD")
    }
    assert codes == {
        "MINIMAL": [],
        "BASIC": ["LAYOUT_PASCAL_CASE"],
        "STANDARD": ["LAYOUT_DOC_COMMENT", "LAYOUT_PASCAL_CASE"],
    }
    only = _lint_json("case.soa", "--select", "layout_doc_comment")[1]
    assert [d["code"] for d in only] == ["LAYOUT_DOC_COMMENT"]


def test_schema_errors_are_reported_not_linted(in_tmp: Path) -> None:
    (in_tmp / "broken.soa").write_text(CLEAN.replace("float32 x", "float33 x"))
    (in_tmp / "case.soa").write_text(CASES["ALIGN_CACHE_LINE"][0])
    status, out, _ = run_cli("lint", "broken.soa", "case.soa", "--format", "json")
    report = json.loads(out)
    assert status == 1
    assert [(d["code"], d["path"], d["line"]) for d in report["diagnostics"]] == [
        ("SOA101", "broken.soa", 6),
        ("ALIGN_CACHE_LINE", "case.soa", 5),
    ]
    assert (report["findings"], report["schema_errors"], report["files"]) == (1, 1, 2)


def test_unused_counts_models_of_importing_files(in_tmp: Path) -> None:
    (in_tmp / "shared").mkdir()
    (in_tmp / "models").mkdir()
    common = (REPO / "tests" / "golden" / "common.soa").read_text()
    vertexing = (REPO / "tests" / "golden" / "vertexing.soa").read_text()
    (in_tmp / "shared" / "common.soa").write_text(common)
    (in_tmp / "models" / "vertexing.soa").write_text(
        vertexing.replace('import "common.soa"', 'import "../shared/common.soa"')
    )
    alone = _lint_json("shared/common.soa", "--select", "LAYOUT_UNUSED")[1]
    assert [(d["code"], d["line"], d["column"]) for d in alone] == [("LAYOUT_UNUSED", 4, 8)]
    together = _lint_json("shared/common.soa", "models/vertexing.soa", "--select", "LAYOUT_UNUSED")[
        1
    ]
    assert together == []
    # Only files named are linted: vertexing.soa's import is not.
    imported = _lint_json("models/vertexing.soa", "--select", "LAYOUT_DOC_COMMENT")[1]
    assert [(d["path"], d["line"]) for d in imported] == [("models/vertexing.soa", 3)]


def test_unused_counts_models_of_schemas_beside_it(in_tmp: Path) -> None:
    """pre-commit passes only changed files: a changed shared file still sees its importers."""
    for name in ("common.soa", "vertexing.soa"):
        (in_tmp / name).write_text((REPO / "tests" / "golden" / name).read_text())
    (in_tmp / "broken.soa").write_text("layout {")  # beside it, not linted: no effect
    assert _lint_json("common.soa", "--select", "LAYOUT_UNUSED") == (0, [])


def test_pyproject_config_found_by_walking_up(in_tmp: Path) -> None:
    (in_tmp / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.soagen.lint]\n'
        'select = ["BASIC"]\nignore = ["MEMBER_SNAKE_CASE"]\ncache-line = 64\n'
        '[tool.soagen.lint.per-file-ignores]\n"legacy/**" = ["LAYOUT_PASCAL_CASE"]\n'
        '[tool.soagen.lint.per-file-select]\n"public/*.soa" = ["LAYOUT_DOC_COMMENT"]\n'
    )
    schema = CLEAN.replace("/// Hits of a tracker.\n", "").replace("align 128", "align 64")
    schema = schema.replace("Hits", "hits").replace("detector_id", "detectorId")
    for folder in ("deep/er", "legacy/old", "public"):
        (in_tmp / folder).mkdir(parents=True)
        (in_tmp / folder / "s.soa").write_text(schema)
    found = {
        folder: sorted(str(d["code"]) for d in _lint_json(f"{folder}/s.soa")[1])
        for folder in ("deep/er", "legacy/old", "public")
    }
    assert found == {
        "deep/er": ["LAYOUT_PASCAL_CASE"],  # align 64 is fine at cache-line 64
        "legacy/old": [],
        "public": ["LAYOUT_DOC_COMMENT", "LAYOUT_PASCAL_CASE"],
    }
    # From inside a folder the same pyproject applies: it is found from the schema, not the cwd.
    os.chdir(in_tmp / "deep")
    assert [d["code"] for d in _lint_json("er/s.soa")[1]] == ["LAYOUT_PASCAL_CASE"]
    # --select replaces the configured list; --config names another file.
    assert "MEMBER_SNAKE_CASE" not in [
        d["code"] for d in _lint_json("er/s.soa", "--select", "STANDARD")[1]
    ]
    (in_tmp / "other.toml").write_text("[tool.soagen.lint]\nselect = ['MEMBER_SNAKE_CASE']\n")
    other = _lint_json("er/s.soa", "--config", str(in_tmp / "other.toml"))[1]
    assert [d["code"] for d in other] == ["MEMBER_SNAKE_CASE"]


def test_nearest_pyproject_with_a_soagen_table_wins(in_tmp: Path) -> None:
    (in_tmp / "pyproject.toml").write_text("[tool.soagen.lint]\nignore = ['LAYOUT_PASCAL_CASE']\n")
    (in_tmp / "sub").mkdir()
    (in_tmp / "sub" / "pyproject.toml").write_text("[project]\nname = 'no-soagen-table'\n")
    (in_tmp / "sub" / "s.soa").write_text(CASES["LAYOUT_PASCAL_CASE"][0])
    assert run_cli("lint", "sub/s.soa")[0] == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[tool.soagen.lint]\nselect = ['LAYOUT_PASCAL']\n", "did you mean `LAYOUT_PASCAL_CASE`?"),
        ("[tool.soagen.lint]\nselct = ['BASIC']\n", "unknown setting `tool.soagen.lint.selct`"),
        ("[tool.soagen.lint]\ncache-line = 100\n", "cache-line` must be a power of two"),
        ("[tool.soagen.lint]\nselect = 'BASIC'\n", "`tool.soagen.lint.select` must be a list"),
        ("[tool.soagen\n", "not valid TOML"),
    ],
)
def test_bad_config_is_a_usage_error_naming_the_file(
    in_tmp: Path, config: str, message: str
) -> None:
    (in_tmp / "pyproject.toml").write_text(config)
    (in_tmp / "clean.soa").write_text(CLEAN)
    status, _, err = run_cli("lint", "clean.soa")
    assert status == 2
    assert str(in_tmp / "pyproject.toml") in err and message in err


def test_usage_errors(in_tmp: Path) -> None:
    (in_tmp / "clean.soa").write_text(CLEAN)
    assert run_cli("lint", "missing.soa")[0] == 2
    assert run_cli("lint", "clean.soa", "--select", "NOPE")[0] == 2
    # A wrong rule is named even when the file has schema errors (they used to hide it).
    (in_tmp / "broken.soa").write_text("layout A {\n    column floot x\n}\n")
    status, _, stderr = run_cli("lint", "broken.soa", "--ignore", "NOPE")
    assert status == 2 and "--ignore: unknown rule or category `NOPE`" in stderr, stderr
    assert run_cli("lint", "clean.soa", "--format", "xml")[0] == 2
    assert run_cli("lint")[0] == 2  # default folder `schemas` does not exist here


def test_explain_and_list_rules() -> None:
    status, out, _ = run_cli("explain", "layout_unused")
    assert status == 0 and out.startswith("LAYOUT_UNUSED (STANDARD): every layout is bound")
    status, out, _ = run_cli("lint", "--list-rules", "--format", "json")
    assert status == 0
    assert json.loads(out)["rules"] == [
        {"id": code.id, "category": code.category, "purpose": code.purpose}
        for code in of_kind(LINT)
    ]
    status, out, _ = run_cli("lint", "--list-rules")
    assert status == 0 and [line.split()[:2] for line in out.splitlines()] == [
        [code.id, code.category] for code in of_kind(LINT)
    ]


def test_name_suggestions() -> None:
    assert to_pascal_case("edge_scores") == "EdgeScores"
    assert to_pascal_case("edgeScores") == "EdgeScores"
    assert to_snake_case("EdgeScores") == "edge_scores"
    assert to_snake_case("HTTPServer2") == "http_server2"
    assert to_snake_case("pfCandidates_PT") == "pf_candidates_pt"


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        ("./.legacy/*.soa", True),  # `./` is dropped, the dot of `.legacy` kept
        (".legacy/*.soa", True),
        ("legacy/*.soa", False),
        ("*.soa", True),  # no slash: the file name alone
        ("./*.soa", False),  # a slash: the path from the config's folder
    ],
)
def test_per_file_patterns_keep_leading_dots(tmp_path: Path, pattern: str, matches: bool) -> None:
    from soagen.tools.lint import path_matches

    (tmp_path / ".legacy").mkdir()
    schema = tmp_path / ".legacy" / "a.soa"
    schema.write_text("")
    assert path_matches(pattern, schema, tmp_path) is matches
