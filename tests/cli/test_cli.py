"""The `soagen` command as a user runs it: generate, show, check, explain, exit codes, diagnostics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from soagen.dsl.codes import REGISTRY
from tests.helpers import REPO, run_cli

WORKED_EXAMPLE = """
layout Example {{
    align {align}
    column float32 x, y, z
    column int32 id
    scalar float64 bfield
    column float32[3] v
}}
"""


@pytest.fixture
def in_tmp(tmp_path: Path) -> Path:
    previous = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(previous)


def test_generate_writes_module_and_package(in_tmp: Path) -> None:
    (in_tmp / "schemas").mkdir()
    (in_tmp / "schemas" / "gnn.soa").write_text((REPO / "schemas" / "gnn.soa").read_text())
    status, out, err = run_cli("schemas/gnn.soa")
    assert status == 0, err
    assert "wrote generated/gnn.py" in out
    assert (in_tmp / "generated" / "__init__.py").exists()
    assert (in_tmp / "generated" / "gnn.py").read_text() == (
        REPO / "generated" / "gnn.py"
    ).read_text()
    # A second run changes nothing and says so.
    mtime = (in_tmp / "generated" / "gnn.py").stat().st_mtime_ns
    status, out, _ = run_cli("schemas/gnn.soa")
    assert status == 0 and "up to date" in out
    assert (in_tmp / "generated" / "gnn.py").stat().st_mtime_ns == mtime


def test_generate_into_other_folder_with_imports(in_tmp: Path) -> None:
    for name in ("common.soa", "vertexing.soa"):
        (in_tmp / name).write_text((REPO / "tests" / "golden" / name).read_text())
    status, out, err = run_cli("vertexing.soa", "-o", "out/soa")
    assert status == 0, err
    assert sorted(p.name for p in (in_tmp / "out" / "soa").iterdir()) == [
        "__init__.py",
        "common.py",
        "vertexing.py",
    ]


def test_show_worked_example_matches_cmssw(in_tmp: Path) -> None:
    # CMSSW's own dump for this layout at n = 10.
    expected = {128: ([0, 128, 256, 384, 512, 640], 1024), 64: ([0, 64, 128, 192, 256, 320], 512)}
    for align, (offsets, total) in expected.items():
        (in_tmp / "example.soa").write_text(WORKED_EXAMPLE.format(align=align))
        status, out, err = run_cli("show", "example.soa", "--size", "10", "--format", "json")
        assert status == 0, err
        collection = json.loads(out)["collections"][0]
        assert [m["offset"] for m in collection["members"]] == offsets
        assert collection["byte_size"] == total
        v = collection["members"][-1]
        assert v["strides"] == [1, align // 4]  # coefficient stride in elements: 32 at align 128


def test_show_text_table() -> None:
    status, out, _ = run_cli("show", str(REPO / "schemas" / "gnn.soa"), "--size", "1000")
    assert status == 0
    assert "Nodes" in out and "57472 bytes" in out
    assert "EdgeClassifier.edge_index" in out and "(2, 1000)" in out and "(1008, 1)" in out


def test_show_json_agrees_with_generated_classes() -> None:
    from generated.gnn import Edges, Nodes

    status, out, _ = run_cli(
        "show", str(REPO / "schemas" / "gnn.soa"), "-n", "1000", "--format", "json"
    )
    report = {c["layout"]: c for c in json.loads(out)["collections"]}
    for cls in (Nodes, Edges):
        assert report[cls.NAME]["byte_size"] == cls.byte_size(1000)
        assert {m["name"]: m["offset"] for m in report[cls.NAME]["members"]} == cls.offsets(1000)


def test_show_json_reports_packed_columns() -> None:
    status, out, _ = run_cli(
        "show", str(REPO / "tests" / "golden" / "arrays.soa"), "-n", "33", "--format", "json"
    )
    assert status == 0
    jets = next(c for c in json.loads(out)["collections"] if c["layout"] == "Jets")
    samples = next(m for m in jets["members"] if m["name"] == "samples_a")
    assert (samples["kind"], samples["dtype"], samples["array_shape"]) == ("packed", "uint16", [10])
    # 33 entries of 20 bytes, padded to the layout's 64-byte alignment; each entry's values together.
    assert (samples["pitch"], samples["shape"], samples["strides"]) == (704, [33, 10], [10, 1])


def test_check_reports_stale_missing_and_orphaned(in_tmp: Path) -> None:
    (in_tmp / "schemas").mkdir()
    (in_tmp / "schemas" / "gnn.soa").write_text((REPO / "schemas" / "gnn.soa").read_text())
    assert run_cli("schemas/gnn.soa")[0] == 0
    status, out, _ = run_cli("check", "schemas")
    assert status == 0 and "up to date" in out

    module = in_tmp / "generated" / "gnn.py"
    module.write_text(
        module.read_text().replace(
            "ALIGNMENT: _typing.ClassVar[int] = 128", "ALIGNMENT: _typing.ClassVar[int] = 64", 1
        )
    )
    status, out, err = run_cli("check", "schemas")
    assert status == 1
    assert (
        "-    ALIGNMENT: _typing.ClassVar[int] = 64" in out
        and "+    ALIGNMENT: _typing.ClassVar[int] = 128" in out
    )
    assert "out of date" in err

    module.unlink()
    status, out, _ = run_cli("check", "schemas", "--format", "json")
    assert status == 1 and json.loads(out)["stale"][0]["reason"] == "missing"

    assert run_cli("schemas")[0] == 0
    (in_tmp / "generated" / "old.py").write_text(
        "# Generated by soagen 0.1.0 from schemas/old.soa: do not edit.\n"
    )
    status, out, _ = run_cli("check", "schemas", "--format", "json")
    assert status == 1 and json.loads(out)["stale"] == [
        {"module": "generated/old.py", "schema": "", "reason": "orphaned"}
    ]
    # Generating never deletes it: the advice is to.
    status, _, err = run_cli("check", "schemas")
    assert status == 1 and "`rm generated/old.py`" in err and "out of date" not in err


def test_check_of_some_schemas_leaves_modules_of_others_alone(in_tmp: Path) -> None:
    """A module whose schema exists outside the folder checked is not checked, and never called
    orphaned: only modules whose schema is gone get the advice to delete them."""
    (in_tmp / "schemas").mkdir()
    (in_tmp / "mine").mkdir()
    (in_tmp / "schemas" / "gnn.soa").write_text((REPO / "schemas" / "gnn.soa").read_text())
    (in_tmp / "mine" / "tracks.soa").write_text("layout Tracks {\n    column float32 pt\n}\n")
    assert run_cli("schemas/gnn.soa", "mine/tracks.soa")[0] == 0
    status, out, err = run_cli("check", "mine")
    assert status == 0, err
    assert "rm " not in err and "orphan" not in out + err
    assert "not checked: generated/gnn.py (from schemas/gnn.soa)" in err
    status, out, _ = run_cli("check", "mine", "--format", "json")
    report = json.loads(out)
    assert status == 0 and report["stale"] == [] and report["checked"] == 1
    assert report["not_checked"] == ["generated/gnn.py (from schemas/gnn.soa)"]
    # Once that schema is gone, its module is an orphan again.
    (in_tmp / "schemas" / "gnn.soa").unlink()
    status, _, err = run_cli("check", "mine")
    assert status == 1 and "`rm generated/gnn.py`" in err


def test_output_folder_files_soagen_did_not_write(in_tmp: Path) -> None:
    (in_tmp / "schemas").mkdir()
    (in_tmp / "schemas" / "gnn.soa").write_text((REPO / "schemas" / "gnn.soa").read_text())
    (in_tmp / "generated").mkdir()
    # Not UTF-8, beside the modules: checked without a traceback, and left alone.
    (in_tmp / "generated" / "legacy.py").write_bytes(b"# caf\xe9\n")
    (in_tmp / "generated" / "folder.py").mkdir()
    assert run_cli("schemas")[0] == 0
    status, out, err = run_cli("check", "schemas")
    assert status == 0, err
    # A hand-written module of a generated module's name is never overwritten.
    module = in_tmp / "generated" / "gnn.py"
    module.write_bytes(b"precious = 1  # caf\xe9\n")
    status, _, err = run_cli("schemas")
    assert status == 2 and "`generated/gnn.py` exists and was not generated by soagen" in err
    assert module.read_bytes() == b"precious = 1  # caf\xe9\n"
    status, out, _ = run_cli("check", "schemas", "--format", "json")
    assert status == 1 and json.loads(out)["stale"][0]["reason"] == "not generated"
    status, out, err = run_cli("check", "schemas")
    assert status == 1 and "was not generated by soagen" in out and "run `soagen" not in err
    module.unlink()
    status, out, err = run_cli("check", "schemas")
    assert status == 1 and out == "generated/gnn.py: missing (generated from schemas/gnn.soa)\n"
    # -o naming a file: the option is named, in JSON too.
    (in_tmp / "afile").write_text("")
    status, _, err = run_cli("schemas", "-o", "afile")
    assert status == 2 and err.startswith("soagen: error: -o afile: cannot make that folder")
    status, out, _ = run_cli("--format", "json", "-o", "afile", "schemas")  # options first
    assert status == 2 and json.loads(out)["error"].startswith("-o afile:")
    status, out, _ = run_cli("-o", "elsewhere", "schemas")
    assert status == 0 and (in_tmp / "elsewhere" / "gnn.py").exists()
    status, out, _ = run_cli("schemas", "-o", "show")  # an option's value that names a command
    assert status == 0 and (in_tmp / "show" / "gnn.py").exists()


def test_generate_writes_nothing_when_one_target_is_not_its_own(in_tmp: Path) -> None:
    for name in ("common.soa", "vertexing.soa"):
        (in_tmp / name).write_text((REPO / "tests" / "golden" / name).read_text())
    (in_tmp / "out").mkdir()
    (in_tmp / "out" / "vertexing.py").write_text("precious = 1\n")
    status, _, err = run_cli("vertexing.soa", "-o", "out")
    assert status == 2 and "`out/vertexing.py` exists and was not generated" in err
    assert sorted(p.name for p in (in_tmp / "out").iterdir()) == ["__init__.py", "vertexing.py"]


def test_schema_errors_exit_1_with_located_diagnostics(in_tmp: Path) -> None:
    (in_tmp / "bad.soa").write_text(
        "layout A {\n    column float33 x\n    column float32 y\n}\nmodel M {\n"
        "    input a = A{y} as [n]\n    output b = B{y}\n}\n"
    )
    status, out, err = run_cli("bad.soa", "--color", "never")
    assert status == 1 and out == ""
    assert "bad.soa:2:12: error[SOA101]: unknown dtype `float33`" in err
    assert "2 |     column float33 x\n               ^^^^^^^" in err
    assert "hint: did you mean `float32`?" in err
    assert "bad.soa:7:16: error[SOA102]: unknown layout `B`" in err
    assert err.rstrip().endswith("2 errors")
    assert not (in_tmp / "generated").exists()  # nothing written when the schema has errors

    status, out, _ = run_cli("bad.soa", "--format", "json")
    assert status == 1
    diagnostics = json.loads(out)["diagnostics"]
    assert [(d["code"], d["line"], d["column"]) for d in diagnostics] == [
        ("SOA101", 2, 12),
        ("SOA102", 7, 16),
    ]


@pytest.mark.parametrize(
    "args",
    [["missing.soa"], ["show", "x.soa"], ["show"], ["--bogus"], ["explain", "SOA999"], []],
)
def test_usage_errors_exit_2(in_tmp: Path, args: list[str]) -> None:
    (in_tmp / "x.soa").write_text("layout X { column float32 a }")
    status, _, _ = run_cli(*args)
    assert status == 2


def test_show_rejects_negative_size(in_tmp: Path) -> None:
    (in_tmp / "x.soa").write_text("layout X { column float32 a }")
    status, _, err = run_cli("show", "x.soa", "--size", "-1")
    assert status == 2 and "--size" in err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["", "-o", "out"], "SCHEMA"),
        (["x.soa", "-o", ""], "-o/--output/--out"),
        (["check", ""], "SCHEMA"),
        (["check", "x.soa", "-o", ""], "-o/--output/--out"),
        (["show", "", "--size", "1"], "SCHEMA"),
        (["lint", ""], "SCHEMA"),
        (["lint", "x.soa", "--config", ""], "--config"),
        (["fmt", "--check", ""], "SCHEMA"),
        (["breaking", "--against", "HEAD", ""], "SCHEMA"),
        (["compile", "", "--model", "M", "--factory", "f.py:f", "-o", "m.pt2"], "SCHEMA"),
        (["compile", "x.soa", "--model", "M", "--factory", "f.py:f", "-o", ""], "-o/--output"),
    ],
)
def test_empty_paths_are_usage_errors(in_tmp: Path, args: list[str], named: str) -> None:
    """`Path("")` is the current folder: an empty argument (an unset shell variable, say) must not
    quietly mean every schema under it, or write there."""
    (in_tmp / "x.soa").write_text("layout X { column float32 a }")
    status, out, err = run_cli(*args)
    assert status == 2, (out, err)
    assert f"argument {named}: empty path" in err
    assert sorted(p.name for p in in_tmp.iterdir()) == ["x.soa"]


def test_explain_and_help_examples() -> None:
    status, out, _ = run_cli("explain", "soa303")
    assert status == 0 and out.startswith("SOA303: ")
    code = REGISTRY["SOA303"]
    assert out == f"SOA303: {code.purpose}\n\n{code.text()}\n"
    assert "Gives SOA303:" in out and "Fixed:" in out
    for command in ("generate", "show", "check", "explain"):
        result = subprocess.run(
            [sys.executable, "-m", "soagen", command, "--help"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert result.returncode == 0 and "example:" in result.stdout, command


def test_explain_json() -> None:
    status, out, _ = run_cli("explain", "SOA303", "--format", "json")
    assert status == 0
    code = REGISTRY["SOA303"]
    shown = json.loads(out)
    assert {key: shown[key] for key in ("id", "kind", "category", "purpose", "explanation")} == {
        "id": "SOA303",
        "kind": "error",
        "category": "binding",
        "purpose": code.purpose,
        "explanation": code.text(),
    }
    assert shown["examples"] == [{"bad": e.bad, "fixed": e.fixed} for e in code.examples]
    # The fields of earlier versions stay.
    assert (shown["code"], shown["summary"]) == ("SOA303", code.purpose)
    for name, kind, category in (
        ("LAYOUT_UNUSED", "lint", "STANDARD"),
        ("member_added", "breaking", "memory"),
    ):
        status, out, _ = run_cli("explain", name, "--format", "json")
        shown = json.loads(out)
        assert status == 0 and (shown["id"], shown["kind"], shown["category"]) == (
            name.upper(),
            kind,
            category,
        )
        assert shown["explanation"].startswith(REGISTRY[name.upper()].explanation)


def test_explain_every_kind_and_unknown_codes() -> None:
    for code in REGISTRY.values():
        status, out, _ = run_cli("explain", code.id.lower())
        assert status == 0 and out == f"{code.heading}\n\n{code.text()}\n", code.id
    assert run_cli("explain", "LAYOUT_REMOVED")[1].startswith(
        "LAYOUT_REMOVED (breaking, source level): a layout was removed or renamed\n\n"
    )
    status, _, err = run_cli("explain", "SOA33")
    assert status == 2
    assert "unknown code `SOA33` (did you mean `SOA303`?)" in err
    assert "soagen lint --list-rules" in err and "soagen explain --list" in err
    status, _, err = run_cli("explain", "NOTHING_LIKE_IT")
    assert status == 2 and "did you mean" not in err and "soagen explain --list" in err
    status, _, err = run_cli("explain")
    assert status == 2 and "soagen explain SOA303" in err


def test_explain_list() -> None:
    status, out, _ = run_cli("explain", "--list")
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()] == list(REGISTRY)
    assert out.splitlines()[0].split(maxsplit=3) == [
        "SOA001",
        "error",
        "syntax",
        REGISTRY["SOA001"].purpose,
    ]
    status, out, _ = run_cli("explain", "--list", "--format", "json")
    assert status == 0
    assert [
        (c["id"], c["kind"], c["category"], c["purpose"]) for c in json.loads(out)["codes"]
    ] == [(c.id, c.kind, c.category, c.purpose) for c in REGISTRY.values()]


def test_cli_never_imports_torch_or_numpy(tmp_path: Path) -> None:
    code = (
        "import sys; from soagen.cli import main;"
        f"rc = main(['{REPO / 'schemas' / 'gnn.soa'}', '-o', '{tmp_path / 'out'}']);"
        f"rc |= main(['show', '{REPO / 'schemas' / 'gnn.soa'}', '-n', '5']);"
        "heavy = sorted(m for m in ('torch', 'numpy') if m in sys.modules);"
        "print(heavy); sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_import_soagen_dsl_imports_no_torch_or_numpy() -> None:
    code = "import sys, soagen.dsl.loader, soagen.runtime; print([m for m in ('torch', 'numpy') if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_closed_pipe_ends_the_output_quietly() -> None:
    # `soagen show ... | head -1`: the reader closes its end before soagen writes.
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "soagen",
            "show",
            "schemas/gnn.soa",
            "--size",
            "1000",
            "--format",
            "json",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1
    assert stderr == ""


def test_generate_and_check_cpp_headers(in_tmp: Path) -> None:
    """`--lang cpp`: headers only (no `__init__.py`), checked, stale and foreign files caught, and
    a schema C++ cannot hold refused with nothing written."""
    for name in ("common.soa", "vertexing.soa", "arrays.soa"):
        (in_tmp / name).write_text((REPO / "tests" / "golden" / name).read_text())
    status, out, err = run_cli("generate", "--lang", "cpp", "vertexing.soa", "-o", "include")
    assert status == 0, err
    assert out == "wrote include/common.h\nwrote include/vertexing.h\n"
    assert sorted(p.name for p in (in_tmp / "include").iterdir()) == ["common.h", "vertexing.h"]
    header = (in_tmp / "include" / "vertexing.h").read_text()
    assert header.startswith("// Generated by soagen ") and '#include "common.h"' in header
    assert run_cli("check", "--lang", "cpp", "vertexing.soa", "-o", "include")[0] == 0
    # The Python check of the same folder sees no modules, and the C++ one ignores Python files.
    assert run_cli("check", "vertexing.soa", "-o", "include")[0] == 1
    common = in_tmp / "include" / "common.h"
    common.write_text(common.read_text() + "// edited\n")
    status, out, err = run_cli("check", "--lang", "cpp", "vertexing.soa", "-o", "include")
    assert status == 1 and "-// edited" in out
    assert "run `soagen generate --lang cpp vertexing.soa -o include`" in err
    assert run_cli("generate", "--lang", "cpp", "vertexing.soa", "-o", "include")[0] == 0
    # A header soagen did not write is never replaced.
    common.write_text("#pragma once  // by hand\n")
    status, _, err = run_cli("generate", "--lang", "cpp", "vertexing.soa", "-o", "include")
    assert status == 2 and "`include/common.h` exists and was not generated by soagen" in err
    assert "`// Generated by soagen ...`" in err
    assert common.read_text() == "#pragma once  // by hand\n"
    status, out, _ = run_cli(
        "check", "--lang", "cpp", "vertexing.soa", "-o", "include", "--format", "json"
    )
    assert status == 1 and json.loads(out)["stale"][0]["reason"] == "not generated"
    common.unlink()
    # An orphan: a header generated from a schema that is gone.
    (in_tmp / "gone.soa").write_text("layout Gone {\n    column float32 x\n}\n")
    assert run_cli("generate", "--lang", "cpp", "gone.soa", "-o", "include")[0] == 0
    (in_tmp / "gone.soa").unlink()
    status, out, err = run_cli("check", "--lang", "cpp", "vertexing.soa", "-o", "include")
    assert status == 1 and "include/gone.h: generated from a schema that no longer exists" in out
    # What C++ cannot hold: located errors, nothing written; Python output is unaffected.
    status, _, err = run_cli("generate", "--lang", "cpp", "arrays.soa", "-o", "refused")
    assert status == 1 and "arrays.soa:29:12: error[SOA501]" in err and "error[SOA502]" in err
    assert not (in_tmp / "refused").exists()
    assert run_cli("generate", "arrays.soa", "-o", "python")[0] == 0
    # A namespace: named in the header's regenerate line and in check's advice.
    status, _, err = run_cli(
        "generate", "--lang", "cpp", "--namespace", "reco::soa", "vertexing.soa", "-o", "ns"
    )
    assert status == 0, err
    text = (in_tmp / "ns" / "vertexing.h").read_text()
    assert "namespace reco::soa {" in text and "--namespace reco::soa vertexing.soa" in text
    assert run_cli("check", "--lang", "cpp", "vertexing.soa", "-o", "ns")[0] == 1
    assert (
        run_cli("check", "--lang", "cpp", "--namespace", "reco::soa", "vertexing.soa", "-o", "ns")[
            0
        ]
        == 0
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--namespace", "a"], "--namespace applies to --lang cpp only"),
        (["--lang", "cpp", "--namespace", "a::new"], "not a C++ namespace"),
        (["--lang", "java"], "invalid choice"),
    ],
)
def test_cpp_usage_errors(in_tmp: Path, args: list[str], message: str) -> None:
    (in_tmp / "a.soa").write_text("layout A {\n    column float32 x\n}\n")
    status, _, err = run_cli("generate", *args, "a.soa", "-o", "out")
    assert status == 2 and message in err
