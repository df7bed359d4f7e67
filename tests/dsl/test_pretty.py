"""The IR pretty-printer: its text parses back to the same IR, and shows the symbolic layout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from soagen.dsl.diagnostics import Span
from soagen.dsl.ir import Model
from soagen.dsl.loader import load
from soagen.dsl.parser import parse
from soagen.dsl.pretty import pretty
from tests.helpers import REPO

SCHEMAS = sorted((REPO / "tests" / "golden").glob("*.soa")) + sorted(
    (REPO / "schemas").glob("*.soa")
)


def _without_places(value: object) -> object:
    """The IR with spans and paths blanked, and default axes made explicit, for comparing meaning."""
    if isinstance(value, Span):
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {}
        for field in dataclasses.fields(value):
            if field.name in ("path",):
                continue
            fields[field.name] = _without_places(getattr(value, field.name))
        return (type(value).__name__, fields)
    if isinstance(value, tuple):
        return tuple(_without_places(item) for item in value)
    return value


@pytest.mark.parametrize("schema_path", SCHEMAS, ids=lambda p: p.name)
def test_pretty_text_parses_back_to_the_same_layouts(schema_path: Path) -> None:
    schema = load(schema_path).unwrap()
    text = pretty(schema.root)
    reparsed, problems = parse(text, "pretty.soa")
    assert not problems and reparsed is not None, problems
    assert _without_places(reparsed.layouts) == _without_places(
        tuple(
            dataclasses.replace(layout, align_statements=((layout.align, layout.span),))
            for layout in schema.root.layouts
        )
    )
    for original, again in zip(schema.root.models, reparsed.models, strict=True):
        assert [b.member_names for b in original.bindings] == [
            b.member_names for b in again.bindings
        ]
        assert all(b.axes is not None for b in again.bindings)  # defaults are written out


def test_pretty_shows_symbolic_offsets() -> None:
    schema = load(REPO / "schemas" / "gnn.soa").unwrap()
    text = pretty(schema.root)
    assert "layout Nodes {  // 14 * pitch_4 + 128 bytes" in text
    assert "scalar float32 bfield  // at 14 * pitch_4" in text
    assert (
        "input edge_index = Edges{src, dst} as [c, n] indexes node_features  "
        "// shape [2, n], strides [stride_8, 1], offset 0" in text
    )


@pytest.mark.parametrize("schema_path", SCHEMAS, ids=lambda p: p.name)
def test_pretty_text_keeps_the_binding_clauses(schema_path: Path) -> None:
    schema = load(schema_path).unwrap()
    reparsed, problems = parse(pretty(schema.root), "pretty.soa")
    assert not problems and reparsed is not None, problems

    def clauses(models: tuple[Model, ...]) -> list[tuple[str, str | None, str | None, bool, bool]]:
        return [
            (b.name, b.indexes, b.same_n_as, b.whole, b.contiguous)
            for model in models
            for b in model.bindings
        ]

    assert clauses(reparsed.models) == clauses(schema.root.models)


def test_pretty_writes_the_clauses_in_canonical_order() -> None:
    schema = load(REPO / "tests" / "golden" / "masked.soa").unwrap()
    text = pretty(schema.root)
    assert "input mask = Masks{mask} as [n] same n as features  // shape [n]" in text
    assert (
        "input node_features = Nodes{x, y, z, energy} as [n, c] whole contiguous  // shape" in text
    )
    assert "input node_mask = Masks{mask} as [n] same n as node_features whole  // shape" in text
