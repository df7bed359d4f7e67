"""Generated code: golden files, determinism, imports, typing, formatting, and safety from hostile text."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from soagen.dsl.layout import block_view, byte_size, member_offsets, member_view
from soagen.dsl.loader import load
from soagen.generator.python import generate
from tests.helpers import REPO, assert_golden, generate_package, import_generated

GOLDEN = REPO / "tests" / "golden"
GOLDEN_SCHEMAS = sorted(GOLDEN.glob("*.soa"))


def _generated_in_repo(schema: Path) -> dict[str, str]:
    # Paths in headers are relative to the working directory: generate as `soagen` run at the root.
    previous = os.getcwd()
    os.chdir(REPO)
    try:
        return generate(load(schema.relative_to(REPO)).unwrap())
    finally:
        os.chdir(previous)


@pytest.mark.parametrize("schema", GOLDEN_SCHEMAS, ids=lambda p: p.name)
def test_golden(schema: Path, request: pytest.FixtureRequest) -> None:
    text = _generated_in_repo(schema)[schema.stem]
    assert_golden(text, GOLDEN / f"{schema.stem}.py", request.config.getoption("--update-golden"))


def test_checked_in_generated_modules_are_current() -> None:
    for schema in sorted((REPO / "schemas").glob("*.soa")):
        for name, text in _generated_in_repo(schema).items():
            assert (REPO / "generated" / f"{name}.py").read_text() == text, name


def test_generation_is_deterministic_across_processes(tmp_path: Path) -> None:
    script = (
        "import sys; from soagen.dsl.loader import load; from soagen.generator.python import generate;"
        "sys.stdout.write(repr(sorted(generate(load(sys.argv[1]).unwrap()).items())))"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        for schema in ("tests/golden/arrays.soa", "tests/golden/vertexing.soa"):
            result = subprocess.run(
                [sys.executable, "-c", script, schema],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            outputs.add((schema, result.stdout))
    assert len(outputs) == 2


def test_generated_metadata_matches_layout_math(tmp_path: Path) -> None:
    schema = load(GOLDEN / "arrays.soa").unwrap()
    generate_package(GOLDEN / "arrays.soa", tmp_path, "pkg_metadata")
    module = import_generated(tmp_path, "pkg_metadata", "arrays")
    for layout in schema.root.layouts:
        cls = getattr(module, layout.name)
        assert cls.ALIGNMENT == layout.align
        assert [m.name for m in cls.MEMBERS] == [m.name for m in layout.members]
        for n in (0, 1, 7, 16, 17, 1000, 123457):
            offsets = member_offsets(layout)
            assert cls.offsets(n) == {k: v.evaluate(n, layout.align) for k, v in offsets.items()}
            assert cls.byte_size(n) == byte_size(layout).evaluate(n, layout.align)
            views = cls.member_views(n)
            for member in layout.members:
                shape, strides, offset = member_view(layout, member).evaluate(n, layout.align)
                assert (views[member.name].shape, views[member.name].strides) == (shape, strides)
                assert views[member.name].offset == offset
    tagger = module.Tagger
    assert [b.name for b in tagger.INPUTS] == [
        "pf",
        "pf_t",
        "kinematics",
        "hessians",
        "weights",
        "weight",
        "samples",
        "cov",
    ]
    jets = schema.layouts["Jets"]
    for binding in schema.root.models[0].bindings:
        spec = next(b for b in (*tagger.INPUTS, *tagger.OUTPUTS) if b.name == binding.name)
        layout = schema.layouts[binding.layout_name]
        for n in (1, 33, 4096):
            got = spec.block.view(n)
            assert (got.shape, got.strides, got.offset) == block_view(binding).evaluate(
                n, layout.align
            )
    # Scalars broadcast over n with stride 0.
    weights = module.Jets.BLOCKS["weights"].view(10)
    assert weights.shape == (2, 10) and weights.strides[1] == 0
    assert weights.strides[0] == 64 // 8  # one scalar pitch at align 64, in float64 elements
    assert jets.align == 64
    # Packed columns: [c, n, 10] steps one 20-byte column pitch between members, ten values
    # between elements, one inside an element.
    samples = module.Jets.BLOCKS["samples"].view(33)
    assert samples.shape == (2, 33, 10)
    assert samples.strides == (-(-33 * 20 // 64) * 64 // 2, 10, 1)


def test_imported_layouts_are_shared_not_copied(tmp_path: Path) -> None:
    generate_package(GOLDEN / "vertexing.soa", tmp_path, "pkg_imports")
    vertexing = import_generated(tmp_path, "pkg_imports", "vertexing")
    common = import_generated(tmp_path, "pkg_imports", "common")
    assert vertexing.Tracks is common.Tracks
    momenta = vertexing.VertexFinder.INPUTS[0].block
    assert momenta.layout == "Tracks" and momenta.view(10).strides == (1, 32)
    assert "momenta" not in common.Tracks.BLOCKS  # a block of another file lives on its model


def _call_doc(module_text: str, model: str) -> str:
    return module_text.split(f"class {model}(")[1].split('"""Run ')[1].split('"""')[0]


def test_same_n_and_whole_reach_the_binding_specs(tmp_path: Path) -> None:
    masked = generate(load(GOLDEN / "masked.soa").unwrap())["masked"]
    assert 'Masks.BLOCKS["mask"],\n            same_n_as="features",\n' in masked
    assert 'indexes="node_features",\n        ),' in masked
    assert 'same_n_as="node_features",\n            whole=True,\n        ),' in masked
    assert "whole=True,\n            contiguous=True,\n        )," in masked
    # Without the clauses, the specs are those of any schema: no field is written as a default.
    schema = tmp_path / "masked.soa"
    text = (GOLDEN / "masked.soa").read_text()
    for clause in (" same n as features", " same n as node_features", " whole"):
        text = text.replace(clause, "")
    schema.write_text(text)
    plain = generate(load(schema).unwrap())["masked"]
    assert "same_n_as=" not in plain and "whole=" not in plain
    assert '_soagen.BindingSpec("mask", "input", Masks.BLOCKS["mask"]),' in plain


def test_batch_size_doc_follows_which_inputs_are_whole() -> None:
    masked = generate(load(GOLDEN / "masked.soa").unwrap())["masked"]
    # Every `indexes` target whole: batch_size runs, and the whole inputs are named.
    batched = _call_doc(masked, "BatchedEdges")
    assert "input node_mask: Masks{mask} as [n] same n as node_features whole\n" in batched
    assert "`batch_size`: run in aligned slices" in batched
    assert "input(s) node_features, node_mask go entire to every slice" in batched
    # An index input of a sliced input: refused, whatever else is whole.
    sliced = _call_doc(masked, "SlicedNodes")
    assert "`batch_size`: refused: the index input(s) edge_index number" in sliced
    # No index input and nothing whole: every collection is sliced alike.
    assert "elements (every\n        collection of the call" in _call_doc(masked, "MaskedNet")


def test_hostile_doc_comments_stay_inert(tmp_path: Path) -> None:
    control = "".join(chr(c) for c in (0, 7, 8, 11, 12, 27, 0x2028, 0x2029, 0x85))
    text = (GOLDEN / "hostile_docs.soa").read_text().replace("form feed", "controls " + control)
    schema = tmp_path / "hostile.soa"
    schema.write_text(text, encoding="utf-8", newline="\n")
    paths = generate_package(schema, tmp_path, "pkg_hostile")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import pkg_hostile.hostile as m;"
        "print(repr(m.Weird.__doc__)); print(repr(m.__doc__));"
        "print(repr(m.Sneaky.__call__.__doc__)); print(m.Weird.MEMBERS[1].name)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    # The injected `os.system("echo pwned")` would print a line of its own; the docstrings hold it as text.
    assert "pwned" not in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1] == "type"
    assert "injected" in result.stdout
    assert 'escaped too: """; raise SystemExit("injected") #' in result.stdout  # a binding's doc
    assert '""" also here """' not in paths["hostile"].read_text().split("class Weird")[0]
    module = import_generated(tmp_path, "pkg_hostile", "hostile")
    assert 'raise SystemExit("injected")' in module.Weird.__doc__
    assert module.Weird.__doc__.startswith('Ends with a quote"')
    assert "\\N{BULLET}" in module.Sneaky.__doc__


GENERATED_FOR_TOOLS = ["schemas", "tests/golden"]


@pytest.fixture(scope="module")
def generated_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every schema generated into one package, for mypy and ruff."""
    root = tmp_path_factory.mktemp("typed")
    for folder in GENERATED_FOR_TOOLS:
        for schema in sorted((REPO / folder).glob("*.soa")):
            generate_package(schema, root, "typed_pkg")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: install soagen with the dev extra")
    return found


def test_generated_code_passes_mypy_strict(generated_tree: Path) -> None:
    result = subprocess.run(
        [_tool("mypy"), "--strict", "--no-incremental", "typed_pkg"],
        cwd=generated_tree,
        capture_output=True,
        text=True,
        # An editable install hides soagen from mypy; point it at the source tree.
        env={**os.environ, "MYPYPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("line_length", ["88", "100"])
def test_generated_code_is_ruff_formatted(generated_tree: Path, line_length: str) -> None:
    # Lint rules that concern code; long lines in docstrings come from the schema's own text.
    for command in (
        ["format", "--check", "--diff"],
        ["check", "--select", "F,I,B,UP", "--target-version", "py310"],
    ):
        result = subprocess.run(
            [_tool("ruff"), *command, "--line-length", line_length, "typed_pkg"],
            cwd=generated_tree,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr
