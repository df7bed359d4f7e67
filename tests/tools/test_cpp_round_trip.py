"""One schema, both sides: `import-cmssw` of the header `generate --lang cpp` writes gives back the
schema's layouts, for random schemas within what C++ holds (no float16 or bfloat16, ranks up to 2,
names C++ does not reserve)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, assume, given
from hypothesis import strategies as st

from soagen.dsl.ir import Layout, Member, MemberKind
from soagen.dsl.loader import load
from soagen.generator.cpp import cpp_problems, generate_cpp, reserved_reason
from soagen.tools.cmssw import import_header
from tests.strategies import DTYPES, IDENTIFIERS, SchemaCase, scaled, valid_schemas

CPP_DTYPES = [dtype for dtype in DTYPES if dtype not in ("float16", "bfloat16")]
CPP_NAMES = IDENTIFIERS.filter(lambda name: reserved_reason(name) is None)


def _cpp_shape(member: Member) -> tuple[int, ...]:
    """`[k, 1]` and `[k]` array columns are one C++ type, `Eigen::Matrix<T, k, 1>`, which imports as
    `[k]`: the same bytes."""
    if member.kind is MemberKind.COLUMN and member.shape[1:] == (1,):
        return member.shape[:1]
    return member.shape


def _cpp_doc(doc: str | None) -> str | None:
    """A doc as a C++ comment holds it: a control character (which would end the comment) as its
    escape, `\\x1b` for ESC."""
    if doc is None:
        return None
    return "".join(c if c.isprintable() or c in "\t\n" else ascii(c)[1:-1] for c in doc)


def _facts(layout: Layout) -> tuple[object, ...]:
    """What a layout is, without the places its parts were read from."""
    members = tuple(
        (member.name, member.kind, member.dtype_name, _cpp_shape(member), _cpp_doc(member.doc))
        for member in layout.members
    )
    return layout.name, layout.align, _cpp_doc(layout.doc), members


@scaled(30, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    case=valid_schemas(names=CPP_NAMES, dtypes=CPP_DTYPES, max_rank=2),
    namespace=st.sampled_from([None, "reco", "cms::soa"]),
)
def test_import_of_the_generated_header_is_the_schema(
    tmp_path_factory: object, case: SchemaCase, namespace: str | None
) -> None:
    import pytest

    assert isinstance(tmp_path_factory, pytest.TempPathFactory)
    folder = tmp_path_factory.mktemp("round_trip")
    for name, text in case.files.items():
        (folder / name).write_bytes(text.encode())
    schema = load(folder / case.root).unwrap()
    # Two layouts can still give one C++ name (`H` and `HSoA`): the generator refuses those.
    assume(not cpp_problems(schema))
    include = folder / "include"
    include.mkdir()
    for stem, text in generate_cpp(schema, namespace).items():
        (include / f"{stem}.h").write_text(text)
    for schema_file in schema.files:
        stem = Path(schema_file.path).stem
        imported = import_header(
            include / f"{stem}.h",
            shown=f"{stem}.h",
            schema_path=f"{stem}.soa",
            include_dirs=[include],
        )
        assert not imported.diagnostics, imported.diagnostics
        assert imported.schema_file is not None
        assert [_facts(layout) for layout in imported.schema_file.layouts] == [
            _facts(layout) for layout in schema_file.layouts
        ]
