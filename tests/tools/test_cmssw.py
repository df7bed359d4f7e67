"""`soagen import-cmssw`: CMSSW-style headers written for these tests (tests/cmssw_headers/, never
CMSSW's own) become the exact schemas below; what cannot be imported is a located SOA6xx error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soagen.cli.main import main
from soagen.dsl.codes import REGISTRY
from soagen.dsl.layout import byte_size, member_offsets
from soagen.dsl.loader import load
from soagen.tools.cmssw import (
    HeaderImport,
    TypeMapping,
    import_header,
    layout_name,
    parse_define,
    parse_type_mapping,
    schema_stem,
)
from soagen.tools.fmt import schema_text
from tests.helpers import REPO

HEADERS = REPO / "tests" / "cmssw_headers"
INCLUDE = HEADERS / "include"

HITS_SOA = """\
//! Imported from Hits.h by soagen import-cmssw.

/// Hits of one event,
/// one element per hit.
layout Hit {
    align 64
    /// the hit's detector id
    column uint32 id
    /// in GeV
    column float64 energy
    column float32[3] position
    /// covariance of the
    /// position
    column float64[2, 2] covariance
    column float32[2] direction
    column float64[3, 3] rotation
    column uint16[10] adc packed
    column int8[6, 4] grid packed
    /// imported: detector::hits::Status (enum)
    column int16 status
    /// imported: DetLayer::Layer (enum without a fixed type: 4 bytes with g++)
    column int32 layer
    /// imported: detector::hits::Status (enum)
    scalar int16 worst
    scalar int64 event
    /// hits in use
    /// imported: C++ member `size`, renamed: soagen reserves the name `size`
    scalar uint32 size_value
}
"""

TRACKS_SOA = """\
//! Imported from Tracks.h by soagen import-cmssw.

layout Track {
    /// transverse momentum
    /// in GeV
    column float32 pt
    column uint16 nHits
    column float32[4] hitCharge
    column bool quality
    scalar int32 nTracks
}

layout VertexCounts {
    column int32 counts
    column int8[6] layerFlags packed
}
"""


def _import(
    header: Path,
    *,
    types: dict[str, TypeMapping] | None = None,
    defines: dict[str, int] | None = None,
    layouts: tuple[str, ...] = (),
) -> HeaderImport:
    return import_header(
        header,
        shown=header.name,
        schema_path=f"{schema_stem(header)}.soa",
        include_dirs=[INCLUDE],
        types=types,
        defines=defines,
        layouts=layouts,
    )


def _text(header: Path, **options: object) -> str:
    result = _import(header, **options)  # type: ignore[arg-type]
    assert result.diagnostics == [] and result.schema_file is not None, result.diagnostics
    return schema_text(result.schema_file)


@pytest.mark.parametrize(("header", "expected"), [("Hits.h", HITS_SOA), ("Tracks.h", TRACKS_SOA)])
def test_headers_import_to_exact_schemas(tmp_path: Path, header: str, expected: str) -> None:
    """Eigen matrices, vectors and named typedefs; aliases by `using` and `typedef`; StdArray and
    std::array (nested: [R, C]) sized by constants of included headers, class members, anonymous
    namespaces and #defines; enums with and without a fixed type; nested namespaces; a layout in
    a class template; method blocks with bodies; comments as docs; `)` on its own line."""
    text = _text(HEADERS / header)
    assert text == expected
    written = tmp_path / f"{Path(header).stem}.soa"
    written.write_text(text)
    assert load(written).diagnostics == []  # the schema passes soagen's own checks


def test_layout_offsets_match_a_hand_computed_table(tmp_path: Path) -> None:
    """Eigen, packed and scalar members at A = 64: each offset worked out by hand from CMSSW's
    rules (a column pads to A, an Eigen column is one padded column per coefficient, a packed
    column pads n * sizeof(element), a scalar takes A)."""
    header = tmp_path / "Small.h"
    header.write_text(
        "using V = Eigen::Matrix<float, 2, 1>;\n"
        "using A = edm::StdArray<uint16_t, 3>;\n"
        "GENERATE_SOA_LAYOUT(SmallLayout, SOA_COLUMN(double, e), SOA_EIGEN_COLUMN(V, v),\n"
        "    SOA_COLUMN(A, adc), SOA_SCALAR(int, count), SOA_COLUMN(uint8_t, flag))\n"
        "using SmallSoA = SmallLayout<64>;\n"
    )
    result = _import(header)
    assert result.schema_file is not None, result.diagnostics
    (layout,) = result.schema_file.layouts
    expected = {  # n: (e, v, adc, count, flag, total)
        10: (0, 128, 256, 320, 384, 448),
        33: (0, 320, 704, 960, 1024, 1088),
    }
    for n, (*offsets, total) in expected.items():
        forms = member_offsets(layout)
        assert [forms[m.name].evaluate(n, layout.align) for m in layout.members] == offsets
        assert byte_size(layout).evaluate(n, layout.align) == total


def _error(tmp_path: Path, text: str, **options: object) -> tuple[str, int, int, str]:
    header = tmp_path / "Bad.h"
    header.write_text(text)
    result = _import(header, **options)  # type: ignore[arg-type]
    assert result.schema_file is None
    (diagnostic,) = result.diagnostics
    span = diagnostic.span
    return diagnostic.code, span.line, span.column, diagnostic.hint or ""


@pytest.mark.parametrize(
    ("text", "code", "line", "column", "hint_word"),
    [
        ("GENERATE_SOA_LAYOUT(ALayout,\n  SOA_COLUMN(Mystery, m))", "SOA601", 2, 14, "--type"),
        (
            "using Arr = edm::StdArray<float, kMissing>;\n"
            "GENERATE_SOA_LAYOUT(ALayout, SOA_COLUMN(Arr, a))",
            "SOA602",
            1,
            34,
            "--define",
        ),
        (
            "struct Blob { int a; double b; };\nGENERATE_SOA_LAYOUT(ALayout, SOA_COLUMN(Blob, b))",
            "SOA603",
            2,
            41,
            "uint8[SIZE]",
        ),
        ("GENERATE_SOA_LAYOUT(ALayout, SOA_EIGEN_COLUMN(Eigen::MatrixXf, m))", "SOA603", 1, 47, ""),
        (
            "GENERATE_SOA_LAYOUT(ALayout, SOA_EIGEN_COLUMN(Eigen::Matrix<float, -1, 1>, m))",
            "SOA603",
            1,
            47,
            "",
        ),
        (
            "using A3 = edm::StdArray<edm::StdArray<edm::StdArray<int, 2>, 2>, 2>;\n"
            "GENERATE_SOA_LAYOUT(ALayout, SOA_COLUMN(A3, a))",
            "SOA603",
            1,
            12,
            "",
        ),
        (
            "GENERATE_SOA_LAYOUT(ALayout, SOA_SCALAR(std::array<int, 2>, a))",
            "SOA603",
            1,
            41,
            "--layout",
        ),
        ("GENERATE_SOA_LAYOUT(ALayout, SOA_COLUMN(Eigen::Vector3f, v))", "SOA603", 1, 41, "EIGEN"),
        ("GENERATE_SOA_LAYOUT(ALayout, SOA_COLUMN(float, x), SOA_GRID(x))", "SOA603", 1, 52, ""),
        ("#include <cstdint>\nusing Flags = uint16_t;\n", "SOA604", 1, 1, ""),
    ],
)
def test_errors_are_located_and_coded(
    tmp_path: Path, text: str, code: str, line: int, column: int, hint_word: str
) -> None:
    assert _error(tmp_path, text)[:3] == (code, line, column)
    assert hint_word in _error(tmp_path, text)[3]


def test_a_missing_layout_name_is_reported(tmp_path: Path) -> None:
    result = _import(HEADERS / "Tracks.h", layouts=("NoSuchLayout",))
    assert [d.code for d in result.diagnostics] == ["SOA604"]
    assert "TrackLayout, VertexCounts" in (result.diagnostics[0].hint or "")
    only = _import(HEADERS / "Tracks.h", layouts=("Track",))
    assert only.schema_file is not None
    assert [layout.name for layout in only.schema_file.layouts] == ["Track"]


def test_an_error_in_an_alias_names_the_member_too(tmp_path: Path) -> None:
    header = tmp_path / "Alias.h"
    header.write_text(
        "using Hidden = Mystery;\nGENERATE_SOA_LAYOUT(ALayout, SOA_COLUMN(Hidden, h))"
    )
    (diagnostic,) = _import(header).diagnostics
    assert (diagnostic.code, diagnostic.span.line, diagnostic.span.column) == ("SOA601", 1, 16)
    assert [(note, where.line) for note, where in diagnostic.related] == [("member", 2)]


def test_type_and_define_mappings_resolve_what_headers_do_not(tmp_path: Path) -> None:
    header = tmp_path / "Mapped.h"
    header.write_text(
        "template <typename T> struct Packet { T raw; T word; uint8_t type; double fed; };\n"
        "using Packet32 = Packet<uint32_t>;\n"
        "using Samples = edm::StdArray<float, external::kSamples>;\n"
        "GENERATE_SOA_LAYOUT(MappedLayout, SOA_COLUMN(Packet32, packet),\n"
        "    SOA_COLUMN(Samples, samples), SOA_COLUMN(Handle, handle))\n"
    )
    assert [d.code for d in _import(header).diagnostics] == ["SOA603"]
    types = {"Packet32": TypeMapping("uint8", (24,)), "Handle": TypeMapping("uint64")}
    text = _text(header, types=types, defines={"external::kSamples": 5})
    assert "column uint8[24] packet packed" in text
    assert "/// imported: Packet32 as uint8[24] (--type)" in text
    assert "column float32[5] samples packed" in text
    assert "column uint64 handle" in text


CONDITIONAL_HEADER = """\
#ifndef Conditional_h
#define Conditional_h
#define kPlanes 2
#if defined GPU_BACKEND_ENABLED
typedef __half Real;
#else
typedef float Real;
#endif
#ifdef SMALL_EVENTS
  constexpr int kSamples = 2;
#elif __cplusplus >= 201703L && kPlanes > 1
  constexpr int kSamples = 4;  // what a host compile sees
#else
  constexpr int kSamples = 8;
#endif
#if 0
GENERATE_SOA_LAYOUT(DisabledLayout, SOA_COLUMN(float, x))
#endif
using Samples = edm::StdArray<uint16_t, kSamples>;
GENERATE_SOA_LAYOUT(ConditionalLayout,
                    SOA_COLUMN(Real, energy),
#ifndef NO_SAMPLES
                    SOA_COLUMN(Samples, samples),
#endif
                    SOA_SCALAR(uint32_t, count))
#endif
"""


def test_conditional_compilation_keeps_what_a_host_compile_keeps(tmp_path: Path) -> None:
    """`#if`/`#ifdef`/`#elif`/`#else` pick the branches g++ compiles for the host (a backend macro
    no header defines is off; `__cplusplus` is C++20); `--define` turns a macro on."""
    header = tmp_path / "Conditional.h"
    header.write_text(CONDITIONAL_HEADER)
    text = _text(header)
    assert "layout Disabled" not in text
    assert "column float32 energy" in text
    assert "column uint16[4] samples packed" in text
    small = _text(header, defines={"SMALL_EVENTS": 1, "NO_SAMPLES": 1})
    assert "samples" not in small
    (diagnostic,) = _import(header, defines={"GPU_BACKEND_ENABLED": 1}).diagnostics
    assert (diagnostic.code, diagnostic.span.line, diagnostic.message) == (
        "SOA601",
        5,
        "unknown type `__half`",
    )


def test_a_member_constant_through_a_typedef_of_a_class_template(tmp_path: Path) -> None:
    """`typedef Container<Frame> FrameCollection;` reaches the constants the class template
    declares: `FrameCollection::kMaxSamples`."""
    header = tmp_path / "Frames.h"
    header.write_text(
        "class Frame;\n"
        "template <class Digi>\n"
        "class FrameContainer {\n"
        "public:\n"
        "  typedef unsigned int size_type;\n"
        "  static const size_type kMaxSamples = 10;\n"
        "};\n"
        "typedef FrameContainer<Frame> FrameCollection;\n"
        "namespace det {\n"
        "  struct Header { static constexpr int kWords = 1; };\n"
        "  using Words = edm::StdArray<uint16_t, FrameCollection::kMaxSamples + Header::kWords>;\n"
        "  using Collection = ::FrameCollection;\n"
        "  GENERATE_SOA_LAYOUT(FramesLayout, SOA_COLUMN(Words, data),\n"
        "                      SOA_SCALAR(int32_t, n[Collection::kMaxSamples]))\n"
        "}\n"
    )
    result = _import(header)
    assert [d.code for d in result.diagnostics] == ["SOA603"]  # `n[...]` is no member name
    header.write_text(header.read_text().replace("n[Collection::kMaxSamples]", "n"))
    assert "column uint16[11] data packed" in _text(header)


def test_mapping_arguments_are_parsed() -> None:
    assert parse_type_mapping("ns::Blob=uint8[24]") == ("ns::Blob", TypeMapping("uint8", (24,)))
    assert parse_type_mapping(" Id = int32") == ("Id", TypeMapping("int32"))
    assert parse_define("ecal::kSamples=0x10") == ("ecal::kSamples", 16)
    for bad in ("Blob", "Blob=float", "Blob=uint8[0]", "Blob=uint8[2, 3, 4]"):
        with pytest.raises(ValueError, match="--type"):
            parse_type_mapping(bad)
    with pytest.raises(ValueError, match="--define"):
        parse_define("N=ten")


def test_names() -> None:
    assert layout_name("PFRecHitSoALayout") == "PFRecHitSoA"
    assert layout_name("ParticleLayout") == "Particle"
    assert layout_name("SchemaEvolutionSoATemplate") == "SchemaEvolutionSoATemplate"
    assert layout_name("Layout") == "Layout"
    assert schema_stem(Path("a/FooSoA.h")) == "FooSoA"
    assert schema_stem(Path("my-header.hpp")) == "my_header"


# --- every SOA6xx code: its explanation's examples -----------------------------------------------

CMSSW_CODES = [code for code in REGISTRY.values() if code.category == "cmssw"]


@pytest.mark.parametrize("code", CMSSW_CODES, ids=[code.id for code in CMSSW_CODES])
def test_every_cmssw_code_is_reported(tmp_path: Path, code: object) -> None:
    """Each code's `Gives` header reports it (and only it); its `Fixed` header imports."""
    from soagen.dsl.codes import Code

    assert isinstance(code, Code) and code.examples
    for example in code.examples:
        assert example.language == "cpp"
        header = tmp_path / "Example.h"
        header.write_text(example.bad + "\n")
        assert {d.code for d in _import(header).diagnostics} == {code.id}
        if example.fixed is not None:
            header.write_text(example.fixed + "\n")
            assert _import(header).diagnostics == []


# --- the command --------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["import-cmssw", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_cli_writes_one_schema_per_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(HEADERS)
    out = tmp_path / "schemas"
    status, _, err = _run(capsys, "Hits.h", "Tracks.h", "-I", "include", "-o", str(out))
    assert status == 0, err
    assert (out / "Hits.soa").read_text() == HITS_SOA
    assert (out / "Tracks.soa").read_text() == TRACKS_SOA
    # Formatted as `soagen fmt` writes it, and checked.
    assert main(["fmt", "--check", str(out)]) == 0
    assert main(["check", str(out / "Hits.soa"), "-o", str(tmp_path / "gen")]) in (0, 1)
    # The same again is fine; a file that differs is refused without --force.
    assert _run(capsys, "Hits.h", "-I", "include", "-o", str(out))[0] == 0
    (out / "Hits.soa").write_text("// edited\n" + HITS_SOA)
    status, _, err = _run(capsys, "Hits.h", "-I", "include", "-o", str(out))
    assert status == 2 and "--force" in err
    assert _run(capsys, "Hits.h", "-I", "include", "-o", str(out), "--force")[0] == 0
    assert (out / "Hits.soa").read_text() == HITS_SOA


def test_cli_prints_one_header_to_stdout_and_reports_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(HEADERS)
    status, out, _ = _run(capsys, "Tracks.h")
    assert (status, out) == (0, TRACKS_SOA)
    status, out, err = _run(capsys, "Hits.h")  # without -I, Layer.h is not found
    assert status == 1 and out == ""
    assert "Hits.h:15:45: error[SOA602]: unknown constant `kSamples`" in err
    assert "hint: give its value: --define kSamples=VALUE" in err
    status, out, _ = _run(capsys, "Hits.h", "--format", "json")
    document = json.loads(out)
    assert status == 1 and [d["code"] for d in document["diagnostics"]] == ["SOA602"]
    assert _run(capsys, "Hits.h", "Tracks.h")[0] == 2  # several headers need -o
    assert _run(capsys, "Tracks.h", "--type", "X=float")[0] == 2
    assert _run(capsys, "NoSuch.h")[0] == 2


def test_readme_worked_example_is_what_the_importer_writes(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### `soagen import-cmssw`", 1)[1].split("\n### ", 1)[0]
    header_text = section.split("```cpp\n", 1)[1].split("```", 1)[0]
    schema = section.split("gives:\n\n```\n", 1)[1].split("```", 1)[0]
    header = tmp_path / "CaloHitSoA.h"
    header.write_text(header_text)
    assert _text(header) == schema
