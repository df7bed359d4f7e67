"""Robustness properties over random schemas (strategies in `tests/strategies.py`).

- Any input: the CLI exits 0, 1 or 2, never with a traceback, and locates every error with a code.
- Valid schemas: generation is deterministic, the modules import with no side effects, their layout
  math equals the independent reference of `test_layout_reference.py`, `mypy --strict` and
  `ruff format` accept them, and a buffer written through every member view holds each value at the
  byte the reference computes, padding untouched.
- Names and doc comments cannot inject code: hostile docs come back as written, odd names are either
  refused with a diagnostic or become exactly those Python names.

Example counts come from the hypothesis profile (conftest.py: `ci` by default, `long` with
`HYPOTHESIS_PROFILE=long`), scaled per property by `strategies.scaled`.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from soagen.cli import main
from soagen.dsl.codes import ERROR, of_kind
from soagen.dsl.loader import load
from soagen.generator.python import generate
from tests.dsl.test_layout_reference import SIZES, Reference, RefMember, ref_address, ref_offsets
from tests.helpers import REPO
from tests.strategies import (
    BINDING_RESERVED,
    IDENTIFIERS,
    LAYOUT_RESERVED,
    LONG_IDENTIFIERS,
    MEMBER_RESERVED,
    SchemaCase,
    invalid_schemas,
    is_valid_name,
    scaled,
    valid_schemas,
)

# A file hostile doc comments would create if their text ran as code.
SENTINEL = Path(tempfile.gettempdir()) / f"soagen-robustness-pwned-{os.getpid()}"
ERROR_CODES = {code.id for code in of_kind(ERROR)}
LOCATED = re.compile(
    r"^(?P<path>.+):(?P<line>\d+):(?P<column>\d+): error\[(?P<code>[A-Z0-9_]+)\]: .+$"
)
SIZES_N = [0, 1, 2, 31, 33, 1000, 10**7]


def write_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        # newline="": the text's own line ends (`\r\n` in some cases) reach the file unchanged.
        (folder / name).write_text(text, encoding="utf-8", errors="surrogatepass", newline="")


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        status = main(list(args))
    except SystemExit as exit:  # argparse's own usage errors
        status = exit.code if isinstance(exit.code, int) else 2
    out, err = capsys.readouterr()
    return status, out, err


def assert_located(stderr: str, paths: set[str]) -> int:
    """Every error line reads `path:line:col: error[CODE]: message`, in a file of the run and with
    a known code; returns how many there are."""
    errors = [line for line in stderr.splitlines() if "error[" in line]
    assert errors, stderr
    for line in errors:
        match = LOCATED.match(line)
        assert match is not None, line
        assert match["code"] in ERROR_CODES, line
        assert match["path"] in paths, (line, paths)
        assert int(match["line"]) >= 1 and int(match["column"]) >= 1, line
    return len(errors)


# --- any input --------------------------------------------------------------------------------------


ANY_FILES = st.one_of(invalid_schemas(), valid_schemas(max_layouts=2).map(lambda c: c.files))


@scaled(60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(files=ANY_FILES)
def test_cli_exits_cleanly_and_locates_every_error(
    capsys: pytest.CaptureFixture[str], files: dict[str, str]
) -> None:
    capsys.readouterr()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_files(folder, files)
        schema, out = str(folder / "schema.soa"), str(folder / "out")
        paths = {(folder / file).as_posix() for file in files}
        results = {
            "ir": run_main(capsys, "show", "--ir", schema),
            "generate": run_main(capsys, schema, "-o", out),
            "check": run_main(capsys, "check", schema, "-o", out),
            "json": run_main(capsys, "generate", "--format", "json", schema, "-o", out),
        }
        for what, (status, stdout, stderr) in results.items():
            assert status in (0, 1, 2), (what, status, stderr)
            assert "Traceback" not in stdout + stderr, (what, stderr)
        status, _, stderr = results["generate"]
        # One verdict per schema: what generates is current right after, what fails fails alike.
        assert results["check"][0] == status == results["ir"][0] == results["json"][0]
        if status == 0:
            assert (folder / "out" / "schema.py").is_file()
            assert "error[" not in results["ir"][2]
            return
        assert status == 1, stderr
        count = assert_located(stderr, paths)
        assert count == assert_located(results["check"][2], paths)
        assert re.search(rf"^{count} errors?$", stderr, re.M), stderr
        diagnostics = json.loads(results["json"][1])["diagnostics"]
        assert len(diagnostics) == count
        for diagnostic in diagnostics:
            assert diagnostic["code"] in ERROR_CODES
            assert diagnostic["path"] in paths
            assert diagnostic["line"] >= 1 and diagnostic["column"] >= 1
        assert not (folder / "out" / "schema.py").exists()


@scaled(3)
@given(files=invalid_schemas())
def test_cli_in_a_subprocess_exits_cleanly(files: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_files(folder, files)
        for args in (["show", "--ir", "schema.soa"], ["schema.soa", "-o", "out"]):
            result = subprocess.run(
                [sys.executable, "-m", "soagen", *args],
                cwd=folder,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                env={**os.environ, "PYTHONPATH": str(REPO)},
                timeout=60,
            )
            assert result.returncode in (0, 1), result.stderr
            assert "Traceback" not in result.stdout + result.stderr
            if result.returncode == 1:
                assert_located(result.stderr, {file for file in files})


@pytest.mark.parametrize(
    "args",
    [
        ["show"],
        ["show", "--size", "-3", "schema.soa"],
        ["show", "--size", "x", "schema.soa"],
        ["check", "no/such/folder"],
        ["explain", "SOA999"],
        ["--format", "yaml", "schema.soa"],
        ["schema.soa", "-o"],
        ["no-such.soa"],
    ],
)
def test_cli_usage_errors_exit_2_without_a_traceback(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "schema.soa").write_text("layout A {\n    column float32 x\n}\n")
    result = subprocess.run(
        [sys.executable, "-m", "soagen", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("path", ["\x00", "a\x00.soa", "/" * 5000 + "a.soa", "missing/a.soa"])
def test_cli_odd_paths_exit_cleanly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Paths no file system takes (a NUL, too long) or missing: usage or schema errors."""
    monkeypatch.chdir(tmp_path)
    for args in (["show", "--ir", path], [path, "-o", "out"], ["check", path]):
        status, stdout, stderr = run_main(capsys, *args)
        assert status in (1, 2), (args, stdout, stderr)
        assert "Traceback" not in stdout + stderr


# --- valid schemas ----------------------------------------------------------------------------------

_packages = itertools.count()


@pytest.fixture(scope="module")
def package_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("robust_packages")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def generate_case(case: SchemaCase, root: Path) -> tuple[str, dict[str, str], Path]:
    """Write the schema's files and its generated modules into a fresh package under `root`;
    returns the package name, the modules' sources and the schema folder."""
    package = f"robust_{next(_packages)}"
    target = root / package
    target.mkdir()
    write_files(target, case.files)
    result = load(target / case.root)
    assert result.schema is not None, [(d.code, d.message) for d in result.diagnostics]
    modules = generate(result.schema)
    assert modules == generate(load(target / case.root).unwrap()), "generation is not deterministic"
    (target / "__init__.py").write_text("")
    for module, text in modules.items():
        (target / f"{module}.py").write_text(text, encoding="utf-8")
    return package, modules, target


def import_case(package: str, modules: dict[str, str]) -> dict[str, ModuleType]:
    importlib.invalidate_caches()
    return {name: importlib.import_module(f"{package}.{name}") for name in modules}


def docstring_of(source: str, *path: str) -> str | None:
    """The exact docstring of a class (or of one of its methods) as written in the source, with the
    indentation the generator adds taken off again."""
    node: ast.AST = ast.parse(source)
    for name in path:
        body = node.body  # type: ignore[attr-defined]
        node = next(
            n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name
        )
    doc = ast.get_docstring(node, clean=False)  # type: ignore[arg-type]
    if doc is None:
        return None
    indent = "    " * len(path)
    lines = doc.split("\n")
    if len(lines) > 1:
        assert lines[-1] == indent, repr(doc)  # the closing quotes' own line
        lines = [lines[0]] + [line.removeprefix(indent) for line in lines[1:-1]]
    return "\n".join(lines)


def listed_binding_doc(call_doc: str, direction: str, name: str) -> str | None:
    """The doc comment of one binding as `__call__`'s docstring lists it: the lines below the
    binding's own line, indented by four spaces."""
    lines = call_doc.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{direction} {name}: "))
    doc = []
    for line in lines[start + 1 :]:
        if line and not line.startswith("    "):
            break
        doc.append(line.removeprefix("    "))
    return "\n".join(doc).strip("\n") or None


def expected_axes(
    binding_members: tuple[str, ...], axes: tuple[str, ...] | None, member: RefMember
):  # type: ignore[no-untyped-def]
    if axes is not None:
        return axes
    return ("n", *(["c"] if len(binding_members) > 1 else []), *map(str, member.shape))


def corners(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    if any(extent == 0 for extent in shape):
        return []
    return list(itertools.product(*({0, extent // 2, extent - 1} for extent in shape)))


def check_layout_class(cls: type, layout_members: list[RefMember], align: int) -> None:
    """The generated class's metadata and closed forms against the reference, at many n."""
    assert cls.ALIGNMENT == align  # type: ignore[attr-defined]
    specs = cls.MEMBERS  # type: ignore[attr-defined]
    assert [(m.name, m.kind, m.dtype, m.shape) for m in specs] == [
        (m.name, m.kind, m.dtype, m.shape) for m in layout_members
    ]
    for n in SIZES_N:
        offsets, total = ref_offsets(layout_members, n, align)
        assert cls.offsets(n) == offsets, n  # type: ignore[attr-defined]
        assert cls.byte_size(n) == total, n  # type: ignore[attr-defined]
        views = cls.member_views(n)  # type: ignore[attr-defined]
        for member in layout_members:
            view = views[member.name]
            size = SIZES[member.dtype]
            assert view.dtype == member.dtype
            if member.kind == "scalar":
                assert (view.shape, view.strides, view.offset) == ((), (), offsets[member.name])
                continue
            assert view.shape == (n, *member.shape)
            for index in corners(view.shape):
                got = (
                    view.offset
                    + sum(i * s for i, s in zip(index, view.strides, strict=True)) * size
                )
                expected = ref_address(member, offsets[member.name], n, align, index[0], index[1:])
                assert got == expected, (member, n, index)


@scaled(40)
@given(case=valid_schemas(sentinel=str(SENTINEL)))
def test_valid_schemas_generate_importable_code_matching_the_reference(
    package_root: Path, case: SchemaCase
) -> None:
    package, modules, _ = generate_case(case, package_root)
    imported = import_case(package, modules)
    assert not SENTINEL.exists()
    for module_name, module in imported.items():
        declared = [layout.name for layout in case.layouts if layout.file == f"{module_name}.soa"]
        if module_name == "schema":
            declared += [model.name for model in case.models]
        imports = [layout.name for layout in case.layouts if layout.file != f"{module_name}.soa"]
        imports = imports if module_name == "schema" else []
        assert sorted(module.__all__) == sorted(declared + imports)
        # Importing defines the classes and nothing else: no name a doc or a name could have added.
        private = {"annotations", "_typing", "_soagen", "__all__", "__builtins__", "__cached__"}
        private |= {"__doc__", "__file__", "__loader__", "__name__", "__package__", "__spec__"}
        assert set(vars(module)) - (private - set(declared + imports)) == set(declared + imports)
        assert all(isinstance(getattr(module, name), type) for name in declared + imports)
    for layout in case.layouts:
        cls = getattr(imported[layout.file.removesuffix(".soa")], layout.name)
        # Imported layouts are the imported module's classes, not copies.
        assert getattr(imported["schema"], layout.name) is cls
        check_layout_class(cls, layout.members, layout.alignment)
    schema_module = imported["schema"]
    for model in case.models:
        cls = getattr(schema_module, model.name)
        inputs = [b for b in model.bindings if b.direction == "input"]
        outputs = [b for b in model.bindings if b.direction == "output"]
        assert [spec.name for spec in cls.INPUTS] == [b.name for b in inputs]
        assert [spec.name for spec in cls.OUTPUTS] == [b.name for b in outputs]
        for spec, binding in zip((*cls.INPUTS, *cls.OUTPUTS), inputs + outputs, strict=True):
            layout = case.layout(binding.layout)
            members = {m.name: m for m in layout.members}
            first = members[binding.members[0]]
            axes = expected_axes(binding.members, binding.axes, first)
            block = spec.block
            assert (block.layout, block.members, block.dtype) == (
                layout.name,
                binding.members,
                first.dtype,
            )
            assert block.axes == axes
            assert spec.indexes == binding.indexes
            assert spec.contiguous == binding.contiguous
            assert spec.same_n_as == binding.same_n_as
            assert spec.whole == binding.whole
            if layout.file == "schema.soa":
                owner = getattr(schema_module, layout.name)
                assert owner.BLOCKS[binding.name] is block
            for n in (0, 1, 33, 1000):
                view = block.view(n)
                ref = Reference(layout.members, n, layout.alignment)
                extents = iter(first.shape)
                shape = tuple(
                    n if a == "n" else len(binding.members) if a == "c" else next(extents)
                    for a in axes
                )
                assert view.shape == shape
                for index in corners(shape):
                    got = view.offset
                    got += (
                        sum(i * s for i, s in zip(index, view.strides, strict=True))
                        * SIZES[first.dtype]
                    )
                    assert got == ref.block_address(list(binding.members), list(axes), index)


# Exactly representable integers per dtype: values stay distinct after the cast.
VALUE_RANGE = {"bool": 2, "int8": 127, "uint8": 255, "float16": 2048, "bfloat16": 256}


@scaled(25)
@given(case=valid_schemas(str(SENTINEL), max_models=1), n=st.integers(0, 40), data=st.data())
def test_buffer_written_through_every_view_holds_each_value_at_the_reference_address(
    package_root: Path, case: SchemaCase, n: int, data: st.DataObject
) -> None:
    """Allocate a zeroed collection, write distinct values through every member view, then read the
    raw bytes with NumPy at the reference's addresses; every other byte stays zero."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    package, modules, _ = generate_case(case, package_root)
    imported = import_case(package, modules)
    layout = data.draw(st.sampled_from(case.layouts))
    cls = getattr(imported[layout.file.removesuffix(".soa")], layout.name)
    align = layout.alignment
    if cls.byte_size(n) > 1 << 24:  # 2**20 alignments over many coefficients: keep memory bounded
        n = 0
    collection = cls.allocate(n, zero=True)
    ref = Reference(layout.members, n, align)
    raw = collection.buffer.numpy()
    assert raw.shape == (ref.total,)
    assert collection.buffer.data_ptr() % align == 0
    expected = np.zeros(ref.total, dtype=np.uint8)
    for number, member in enumerate(layout.members):
        view = getattr(collection, member.name)  # the typed accessor
        dtype = view.dtype
        count = view.numel()
        modulus = VALUE_RANGE.get(member.dtype, 2**15)
        values = (torch.arange(count, dtype=torch.int64) * 7 + number * 131 + 1) % modulus
        values = values.to(dtype).reshape(view.shape)
        view.copy_(values)
        size = SIZES[member.dtype]
        value_bytes = values.reshape(-1).contiguous().view(torch.uint8).numpy().reshape(-1, size)
        # Row-major order of the view's indices: element first, then the array coefficient.
        indices = [()] if member.kind == "scalar" else list(np.ndindex(*view.shape))
        for flat, index in enumerate(indices):
            element, coefficient = (0, ()) if member.kind == "scalar" else (index[0], index[1:])
            address = ref.address(member.name, element, tuple(coefficient))
            expected[address : address + size] = value_bytes[flat]
    assert np.array_equal(raw, expected)
    # Blocks read the same bytes: each entry of a block view equals the value at its reference address.
    for block in cls.BLOCKS.values():
        tensor = collection.block(block.name)
        first = next(m for m in layout.members if m.name == block.members[0])
        size = SIZES[first.dtype]
        copied = torch.empty(tensor.shape, dtype=tensor.dtype).copy_(tensor)  # fresh strides
        entries = copied.view(torch.uint8).numpy().reshape(-1, size)
        for flat, index in enumerate(np.ndindex(*tensor.shape)):
            address = ref.block_address(list(block.members), list(block.axes), index)
            assert np.array_equal(entries[flat], raw[address : address + size]), (block, index)


def test_hostile_docs_reach_the_strategy() -> None:
    """The sentinel the properties look for is the one the hostile docs name."""
    from tests.strategies import HOSTILE_DOCS

    assert any("{sentinel}" in doc and "os.system" in doc for doc in HOSTILE_DOCS)
    assert not SENTINEL.exists()


# --- doc comments and names cannot inject code --------------------------------------------------


@scaled(40)
@given(case=valid_schemas(sentinel=str(SENTINEL)))
def test_doc_comments_come_back_exactly_and_run_nothing(
    package_root: Path, case: SchemaCase
) -> None:
    package, modules, folder = generate_case(case, package_root)
    imported = import_case(package, modules)
    assert not SENTINEL.exists()
    for module_name, module in imported.items():
        doc = case.module_docs[module_name]
        module_doc = docstring_of(modules[module_name])
        assert module_doc is not None and module.__doc__.rstrip("\n") == module_doc
        if doc is None:
            assert module_doc.startswith("Collections and model bindings generated from ")
        else:
            assert module_doc == doc
    for layout in case.layouts:
        module_name = layout.file.removesuffix(".soa")
        source = modules[module_name]
        cls = getattr(imported[module_name], layout.name)
        header = layout.doc or f"The {layout.name} collection."
        class_doc = docstring_of(source, layout.name)
        assert class_doc is not None and class_doc.startswith(header + "\n\nMembers, in CMSSW")
        for spec, (name, doc) in zip(cls.MEMBERS, layout.docs.items(), strict=True):
            assert spec.doc == (doc or "")
            accessor = docstring_of(source, layout.name, name)
            assert accessor is not None
            summary = accessor.split("\n\n", 1)
            noun = "Packed array column" if spec.kind == "packed" else "Array column"
            assert summary[0].startswith(f"{noun} `{name}`" if spec.shape else "")
            assert (summary[1] if len(summary) > 1 else None) == doc
    for model in case.models:
        expected = model.doc or f"Binds the inputs and outputs of model {model.name} to SoA blocks."
        assert docstring_of(modules["schema"], model.name) == expected
        call_doc = docstring_of(modules["schema"], model.name, "__call__")
        assert call_doc is not None
        for binding in model.bindings:
            assert listed_binding_doc(call_doc, binding.direction, binding.name) == binding.doc
    # The module's header names the schema; every line of it stays a comment.
    for source in modules.values():
        header = source.split("\n", 2)[:2]
        assert all(line.startswith("# ") for line in header), header


NAME_TEXT = st.one_of(
    IDENTIFIERS,
    st.text(
        alphabet=st.characters(categories=["L", "Nd", "Mn", "Pc"], codec="utf-8"),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["class", "None", "_x", "__init__", "size", "property", "int", "BLOCKS"]),
)


@scaled(60)
@given(layout=NAME_TEXT, member=NAME_TEXT, model=NAME_TEXT, binding=NAME_TEXT)
def test_names_are_refused_or_become_exactly_those_python_names(
    package_root: Path, layout: str, member: str, model: str, binding: str
) -> None:
    text = (
        f"layout {layout} {{\n    column float32 {member}\n}}\n"
        f"model {model} {{\n    input {binding} = {layout}{{{member}}}\n"
        f"    output {binding}_out = {layout}{{{member}}}\n}}\n"
    )
    package = f"robust_{next(_packages)}"
    target = package_root / package
    target.mkdir()
    (target / "__init__.py").write_text("")
    (target / "schema.soa").write_text(text, encoding="utf-8")
    result = load(target / "schema.soa")
    # What the README allows: ASCII identifiers, no keywords, no leading `_`, none of the names
    # generated classes have, layouts and models not named alike.
    # The language's own keywords are names too wherever the grammar expects a name.
    allowed = (
        is_valid_name(layout, LAYOUT_RESERVED, keywords=False)
        and is_valid_name(model, LAYOUT_RESERVED, keywords=False)
        and model != layout
        and is_valid_name(member, MEMBER_RESERVED, keywords=False)
        and is_valid_name(binding, BINDING_RESERVED, keywords=False)
    )
    assert (result.schema is not None) == allowed, result.diagnostics
    if result.schema is None:
        assert {d.code for d in result.diagnostics} <= {"SOA001", "SOA104", "SOA107", "SOA108"}
        return
    (module_text,) = generate(result.schema).values()
    (target / "schema.py").write_text(module_text, encoding="utf-8")
    module = import_case(package, {"schema": module_text})["schema"]
    layout_cls, model_cls = getattr(module, layout), getattr(module, model)
    assert layout_cls.NAME == layout and model_cls.NAME == model
    assert isinstance(vars(layout_cls)[member], property)
    assert [m.name for m in layout_cls.MEMBERS] == [member]
    assert [spec.name for spec in model_cls.INPUTS] == [binding]
    assert sorted(module.__all__) == sorted({layout, model})


@pytest.mark.parametrize(
    "folder",
    [
        "a\nimport os; os.environ['SOAGEN_PWNED'] = '1'\n#",
        "b\r\nraise SystemExit(4)\r\n#",
        "c\rraise SystemExit(5)\r#",
        "d\"\"\"'''\\",
        "e\x0c\x0b\u2028\x85f",
    ],
    ids=["newline", "crlf", "cr", "quotes", "separators"],
)
def test_schema_paths_cannot_inject_code(
    tmp_path: Path, package_root: Path, monkeypatch: pytest.MonkeyPatch, folder: str
) -> None:
    """The schema's path is printed in the module header's comment lines: a folder with line breaks
    in its name must not end the comment."""
    if sys.platform == "win32":
        pytest.skip("such file names are not allowed on Windows")
    schema_folder = tmp_path / folder
    schema_folder.mkdir()
    (schema_folder / "paths.soa").write_text("layout A {\n    column float32 x\n}\n")
    monkeypatch.chdir(tmp_path)  # paths are shown relative to the working directory
    package = f"robust_{next(_packages)}"
    (package_root / package).mkdir()
    (package_root / package / "__init__.py").write_text("")
    schema = load(schema_folder.relative_to(tmp_path) / "paths.soa").unwrap()
    (text,) = generate(schema).values()
    (package_root / package / "paths.py").write_text(text, encoding="utf-8")
    module = import_case(package, {"paths": text})["paths"]
    assert "SOAGEN_PWNED" not in os.environ
    assert module.A.SCHEMA == schema.root.path  # the literal keeps the path exactly
    assert module.__doc__.startswith("Collections and model bindings generated from ")
    assert module.__doc__.rstrip().endswith("/paths.soa.")
    header = text.split("\n")[:2]
    assert all(line.startswith("# ") and "\r" not in line for line in header), header
    assert header[0].startswith("# Generated by soagen ")


def test_undecodable_folder_names_generate_clean_modules(tmp_path: Path) -> None:
    """A folder whose name is not UTF-8 (`\\xff` on Linux): the path reaches the header as an escape,
    not as a lone surrogate that cannot be written, and the module imports."""
    if sys.platform in ("win32", "darwin"):
        pytest.skip("the file system takes only valid Unicode names")
    folder = tmp_path / os.fsdecode(b"\xffd")
    folder.mkdir()
    (folder / "odd.soa").write_text("layout A {\n    column float32 x\n}\n")
    result = subprocess.run(
        [sys.executable, "-m", "soagen", os.fsdecode(b"\xffd/odd.soa"), "-o", "out"],
        cwd=tmp_path,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    text = (tmp_path / "out" / "odd.py").read_text(encoding="utf-8")
    assert text.startswith("# Generated by soagen ") and "\\udcffd/odd.soa" in text.split("\n")[0]
    code = "import out.odd as m; print(m.A.SCHEMA.encode('utf-8', 'surrogateescape'))"
    check = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == repr(b"\xffd/odd.soa")


def _ruff_format_check(folder: Path, *paths: str) -> None:
    """`ruff format` at its default line length (the one the generator writes for) changes
    nothing."""
    result = subprocess.run(
        [_tool("ruff"), "format", "--check", "--diff", "--line-length", "88", *paths],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_long_schema_paths_stay_in_ruff_format(tmp_path: Path) -> None:
    """`SCHEMA = "<path>"` longer than a line: split as ruff splits it (at its default 88; a line
    of 89 to 100 characters has no form that both 88 and 100 keep)."""
    folder = tmp_path / "src" / "my_experiment" / "reconstruction" / "particle_flow" / "schemas"
    folder.mkdir(parents=True)
    name = "Candidates" + "X" * 45
    (folder / "pf.soa").write_text(f"layout {name} {{\n    column float32 x\n}}\n")
    schema = load(folder / "pf.soa").unwrap()
    (text,) = generate(schema).values()
    (tmp_path / "pf.py").write_text(text, encoding="utf-8")
    _ruff_format_check(tmp_path, "pf.py")
    namespace: dict[str, object] = {"__name__": "pf"}
    exec(compile(text, "pf.py", "exec"), namespace)  # noqa: S102
    cls = namespace[name]
    assert cls.SCHEMA == schema.root.path and cls.NAME == name  # type: ignore[attr-defined]


@scaled(20)
@given(case=valid_schemas(str(SENTINEL), names=LONG_IDENTIFIERS))
def test_long_names_stay_in_ruff_format(package_root: Path, case: SchemaCase) -> None:
    """Names of up to 120 characters: every line holding one is split as ruff splits it."""
    package, modules, folder = generate_case(case, package_root)
    _ruff_format_check(folder, *(f"{module}.py" for module in modules))
    imported = import_case(package, modules)
    for layout in case.layouts:
        cls = getattr(imported[layout.file.removesuffix(".soa")], layout.name)
        assert cls.NAME == layout.name
        assert all(isinstance(vars(cls)[m.name], property) for m in layout.members)


def test_indented_docs_stay_in_ruff_format(tmp_path: Path) -> None:
    """ruff strips a docstring's leading blanks and the indentation its later lines share: docs
    indented that way keep their text exactly, and ruff keeps the docstrings."""
    (tmp_path / "docs.soa").write_text(
        "//!   starts indented\n//!     and so does the rest\n"
        "///    layout\nlayout A {\n    ///      member\n    column float32 x\n}\n"
        "///  model\n///    second line\nmodel M {\n    ///   binding\n    input x = A{x}\n"
        "    output y = A{x}\n}\n"
    )
    (text,) = generate(load(tmp_path / "docs.soa").unwrap()).values()
    (tmp_path / "docs.py").write_text(text, encoding="utf-8")
    _ruff_format_check(tmp_path, "docs.py")
    assert docstring_of(text) == "  starts indented\n    and so does the rest"
    assert docstring_of(text, "A").startswith("   layout\n\nMembers")
    assert docstring_of(text, "A", "x").endswith("\n\n     member")
    assert docstring_of(text, "M") == " model\n   second line"
    assert "input x: A{x} as [n]\n      binding\n" in docstring_of(text, "M", "__call__")


def test_wide_characters_in_docs_count_two_columns(tmp_path: Path) -> None:
    """ruff measures lines in columns: a member doc of 26 CJK characters is 52 columns wide, so its
    `MemberSpec(...)` line, 87 characters long, does not fit in 88 and is split."""
    (tmp_path / "wide.soa").write_text(
        "layout A {\n    /// " + "\u540d\u524d" * 13 + "\n    column float32 x\n}\n",
        encoding="utf-8",
    )
    (text,) = generate(load(tmp_path / "wide.soa").unwrap()).values()
    (tmp_path / "wide.py").write_text(text, encoding="utf-8")
    _ruff_format_check(tmp_path, "wide.py")
    assert '        _soagen.MemberSpec(\n            "x",\n' in text


@pytest.mark.parametrize("text", ["", "// nothing yet\n", "layout Lone {\n    column int8 x\n}\n"])
def test_schemas_with_nothing_to_list_stay_in_ruff_format(tmp_path: Path, text: str) -> None:
    """Empty `__all__` and `BLOCKS`, and no imports: the forms ruff gives empty literals."""
    (tmp_path / "small.soa").write_text(text)
    (module,) = generate(load(tmp_path / "small.soa").unwrap()).values()
    (tmp_path / "small.py").write_text(module, encoding="utf-8")
    _ruff_format_check(tmp_path, "small.py")
    assert ("__all__ = []\n" in module) == (not text.startswith("layout"))


def test_long_names_in_every_generated_construct_stay_in_ruff_format(tmp_path: Path) -> None:
    """A name of 80 to 90 characters in each place a name reaches the generated code: class
    headers, NAME, offsets after a long key, view functions, blocks, accessors, bindings of local
    and imported layouts, `out` of several layouts."""
    long = "_with_a_rather_long_and_descriptive_name" * 2
    hits, tracks, scores = f"Hits{long}", f"Tracks{long}", f"Scores{long}"
    x, y, cov, s, e = (f"{name}{long}" for name in ("x", "y", "cov", "scale", "eta"))
    (tmp_path / "dep.soa").write_text(f"layout {tracks} {{\n    column float32[2] {e}\n}}\n")
    (tmp_path / "schema.soa").write_text(
        f'import "dep.soa"\n'
        f"layout {hits} {{\n    column float32 {x}, {y}\n    column float32[3, 3] {cov}\n"
        f"    scalar float64 {s}\n    column int16 i{long}\n}}\n"
        f"layout {scores} {{\n    column float32 score{long}\n}}\n"
        f"model Classifier{long} {{\n"
        f"    input points{long} = {hits}{{{x}, {y}}} as [c, n]\n"
        f"    input scales{long} = {hits}{{{s}}}\n"
        f"    input tracks{long} = {tracks}{{{e}}}\n"
        f"    output scores{long} = {scores}{{score{long}}}\n"
        f"    output covariances{long} = {hits}{{{cov}}}\n}}\n"
    )
    modules = generate(load(tmp_path / "schema.soa").unwrap())
    for module, text in modules.items():
        (tmp_path / f"{module}.py").write_text(text, encoding="utf-8")
    _ruff_format_check(tmp_path, "schema.py", "dep.py")
    text = modules["schema"]
    # The forms ruff gives each construct, spot-checked.
    assert f"class {hits}(\n    _soagen.Collection\n):\n" in text
    assert f"    def _view_points{long}(\n        n: int,\n    ) -> _soagen.StridedView:" in text
    assert f'        return self._member(\n            "{x}"\n        )\n' in text
    assert f'            "i{long}": (\n                11 * pitch_4 + 128\n            ),' in text
    assert f'            {hits}.BLOCKS[\n                "scales{long}"\n            ],' in text
    assert "                _outputs[0],\n                _outputs[1],\n            ),\n" in text


# --- mypy --strict and ruff on a sample -----------------------------------------------------------


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: install soagen with the dev extra")
    return found


@scaled(1)
@given(cases=st.lists(valid_schemas(str(SENTINEL)), min_size=4, max_size=4))
def test_random_schemas_pass_mypy_strict_and_ruff_format(
    tmp_path_factory: pytest.TempPathFactory, cases: list[SchemaCase]
) -> None:
    root = tmp_path_factory.mktemp("robust_typed")
    for case in cases:
        generate_case(case, root)
    packages = sorted(p.name for p in root.iterdir() if p.is_dir())
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    result = subprocess.run(
        [_tool("mypy"), "--strict", "--no-incremental", *packages],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(REPO)},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    _ruff_format_check(root, *packages)
