"""The IR printed as .soa text (`schema_text`, `soagen show --ir`): fmt's one style, a fixed point of
`soagen fmt`, parsing back to the same IR, with the symbolic layout as trailing comments."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given

from soagen.dsl.check import resolve_file
from soagen.dsl.ir import Model, Schema, SchemaFile
from soagen.dsl.loader import load
from soagen.dsl.parser import parse
from soagen.tools.fmt import schema_text, with_defaults, without_spans
from tests.helpers import REPO, run_cli
from tests.strategies import SchemaCase, scaled, valid_schemas

SCHEMAS = [
    *sorted((REPO / "schemas").glob("*.soa")),
    *sorted((REPO / "tests" / "golden").glob("*.soa")),
    REPO / "tests" / "peer" / "peer.soa",
]


def show_ir(schema_path: Path) -> str:
    schema = load(schema_path).unwrap()
    return schema_text(with_defaults(schema.root), symbolic=True)


def reparsed(text: str, path: str) -> SchemaFile:
    schema_file, problems = parse(text, path)
    assert schema_file is not None and not problems, problems
    return schema_file


@pytest.mark.parametrize("schema_path", SCHEMAS, ids=lambda p: p.name)
def test_show_ir_is_left_unchanged_by_fmt(schema_path: Path, tmp_path: Path) -> None:
    status, out, err = run_cli("show", "--ir", str(schema_path), "--format", "json")
    assert status == 0, err
    texts = json.loads(out)
    assert len(texts) >= 1
    for index, text in enumerate(texts.values()):
        path = tmp_path / f"file{index}.soa"
        path.write_text(text, encoding="utf-8")
        status, out, err = run_cli("fmt", "--check", str(path))
        assert status == 0, (text, out, err)
    # The text form too: each file under a `// path` comment.
    status, out, err = run_cli("show", "--ir", str(schema_path))
    assert status == 0, err
    (tmp_path / "all.soa").write_text(out, encoding="utf-8")
    assert run_cli("fmt", "--check", str(tmp_path / "all.soa"))[0] == 0, out


@pytest.mark.parametrize("schema_path", SCHEMAS, ids=lambda p: p.name)
def test_show_ir_parses_back_to_the_ir_with_its_defaults_written(schema_path: Path) -> None:
    schema = load(schema_path).unwrap()
    for schema_file in schema.files:
        explicit = with_defaults(schema_file)
        text = schema_text(explicit, symbolic=True)
        assert without_spans(reparsed(text, schema_file.path)) == without_spans(explicit)
        assert all(b.axes is not None for m in explicit.models for b in m.bindings)
        assert all(layout.align_statements for layout in explicit.layouts)
        # Nothing but the defaults differs from the file as written.
        assert without_spans(
            with_defaults(
                resolve_file(reparsed(schema_text(schema_file), schema_file.path), schema.layouts)
            )
        ) == without_spans(explicit)


def test_show_ir_shows_symbolic_offsets() -> None:
    text = show_ir(REPO / "schemas" / "gnn.soa")
    assert "layout Nodes {  // 14 * pitch_4 + 128 bytes" in text
    assert "    scalar float32 bfield  // at 14 * pitch_4\n" in text
    assert (
        "    input  edge_index    = Edges{src, dst}           as [c, n] indexes node_features  "
        "// shape [2, n], strides [stride_8, 1], offset 0\n" in text
    )


@pytest.mark.parametrize("schema_path", SCHEMAS, ids=lambda p: p.name)
def test_show_ir_keeps_the_binding_clauses(schema_path: Path) -> None:
    schema = load(schema_path).unwrap()
    again = reparsed(show_ir(schema_path), "again.soa")

    def clauses(models: tuple[Model, ...]) -> list[tuple[str, str | None, str | None, bool, bool]]:
        return [
            (b.name, b.indexes, b.same_n_as, b.whole, b.contiguous)
            for model in models
            for b in model.bindings
        ]

    assert clauses(again.models) == clauses(schema.root.models)


def test_show_ir_writes_the_clauses_in_canonical_order() -> None:
    lines = [
        " ".join(line.split()) for line in show_ir(REPO / "tests/golden/masked.soa").splitlines()
    ]
    assert any(
        line.startswith("input mask = Masks{mask} as [n] same n as features // shape [n]")
        for line in lines
    )
    assert any(
        line.startswith(
            "input node_features = Nodes{x, y, z, energy} as [n, c] whole contiguous // shape"
        )
        for line in lines
    )
    assert any(
        line.startswith(
            "input node_mask = Masks{mask} as [n] same n as node_features whole // shape"
        )
        for line in lines
    )


# --- any schema ---------------------------------------------------------------------------------


def _loaded(case: SchemaCase) -> Schema:
    with tempfile.TemporaryDirectory() as folder:
        for name, text in case.files.items():
            (Path(folder) / name).write_text(text, encoding="utf-8", newline="")
        return load(Path(folder) / case.root).unwrap()


@scaled(25, suppress_health_check=[HealthCheck.too_slow])
@given(valid_schemas())
def test_printed_ir_parses_back_to_itself_and_prints_the_same(case: SchemaCase) -> None:
    """parse(print(ir)) == ir, spans aside, and print(parse(print(ir))) == print(ir): as written,
    and with the defaults and the symbolic layout comments of `show --ir`."""
    schema = _loaded(case)
    for schema_file in schema.files:
        for ir, symbolic in ((schema_file, False), (with_defaults(schema_file), True)):
            text = schema_text(ir, symbolic=symbolic)
            again, problems = parse(text, ir.path)
            assert again is not None and not problems, problems
            assert without_spans(again) == without_spans(ir)
            resolved = resolve_file(again, schema.layouts)
            assert schema_text(resolved, symbolic=symbolic) == text
