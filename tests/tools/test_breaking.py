"""`soagen breaking --against REF` in real temporary git repositories."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from soagen.dsl.layout import byte_size, member_offsets
from soagen.dsl.loader import load
from tests.helpers import run_cli

COMMON = """/// Tracks.
layout Tracks {
    column float32 px, py, pz
    column int16 charge
}
"""

MAIN = """import "common.soa"

/// Hits.
layout Hits {
    align 128
    column float32 x, y, z
    column int32 detector_id
    scalar float32 bfield
}

/// Finds vertices.
model VertexFinder {
    input  momenta   = Tracks{px, py, pz} as [n, c]
    input  positions = Hits{x, y, z}      as [n, c]
    output ids       = Hits{detector_id}
}
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Path]:
    """A repository whose HEAD holds schemas/{common,main}.soa; the test runs inside it."""
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "test@example.org")
    _git(tmp_path, "config", "user.name", "test")
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "common.soa").write_text(COMMON)
    (tmp_path / "schemas" / "main.soa").write_text(MAIN)
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "v1")
    previous = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(previous)


def _edit(repo: Path, name: str, old: str, new: str) -> None:
    path = repo / "schemas" / name
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def _changes(*args: str) -> tuple[int, list[tuple[str, str, str, int, int]]]:
    status, out, err = run_cli("breaking", "--against", "HEAD", *args, "--format", "json")
    assert status in (0, 1), err
    changes = json.loads(out)["changes"]
    return status, [(c["level"], c["code"], c["path"], c["line"], c["column"]) for c in changes]


def test_unchanged_and_reformatted_schemas_are_compatible(repo: Path) -> None:
    status, out, _ = run_cli("breaking", "--against", "HEAD")
    assert status == 0 and "no breaking changes against HEAD" in out
    # Comments, docs, spacing and new declarations break nothing.
    _edit(repo, "main.soa", "    column float32 x, y, z\n", "  // note\n  column float32 x,y,z\n")
    _edit(repo, "main.soa", "/// Hits.", "/// Hits of the tracker.")
    (repo / "schemas" / "main.soa").write_text(
        (repo / "schemas" / "main.soa").read_text()
        + "\n/// New.\nlayout Extra {\n    column int8 e\n}\n"
    )
    assert _changes() == (0, [])


def test_added_member_moves_later_members(repo: Path) -> None:
    _edit(repo, "main.soa", "column float32 x, y, z", "column float32 x, y, z, t")
    status, changes = _changes("schemas")
    assert status == 1
    assert changes == [
        ("memory", "MEMBER_ADDED", "schemas/main.soa", 6, 29),
        ("memory", "MEMBER_OFFSET_CHANGED", "schemas/main.soa", 7, 18),
        ("memory", "MEMBER_OFFSET_CHANGED", "schemas/main.soa", 8, 20),
    ]
    _, out, _ = run_cli("breaking", "--against", "HEAD", "--color", "never")
    # n = 1: every column is one 128-byte line; t pushes detector_id from 384 to 512.
    assert (
        "schemas/main.soa:7:18: breaking[MEMBER_OFFSET_CHANGED]: memory: `Hits.detector_id` "
        "moved from byte 384 to byte 512 (at n = 1)" in out
    )
    assert out.rstrip().endswith("3 breaking changes against HEAD (memory)")


def test_member_added_at_the_end_still_breaks_the_size(repo: Path) -> None:
    _edit(
        repo,
        "main.soa",
        "    scalar float32 bfield\n",
        "    scalar float32 bfield\n    column int8 q\n",
    )
    assert _changes()[1] == [("memory", "MEMBER_ADDED", "schemas/main.soa", 9, 17)]


def test_type_shape_kind_and_alignment(repo: Path) -> None:
    _edit(repo, "common.soa", "column int16 charge", "column int32 charge")
    _edit(repo, "main.soa", "scalar float32 bfield", "column float32 bfield")
    assert _changes()[1] == [
        ("memory", "MEMBER_DTYPE_CHANGED", "schemas/common.soa", 4, 12),
        ("memory", "MEMBER_KIND_CHANGED", "schemas/main.soa", 8, 20),
    ]
    _edit(repo, "main.soa", "align 128", "align 64")
    assert ("memory", "LAYOUT_ALIGN_CHANGED", "schemas/main.soa", 5, 11) in _changes()[1]


def test_packing_an_array_column_moves_its_bytes(repo: Path) -> None:
    """`column uint16[4] adc` -> `... packed`: same dtype, shape and size for some n, but each
    element's values move together, so the member's bytes mean something else."""
    _edit(
        repo,
        "main.soa",
        "scalar float32 bfield\n",
        "scalar float32 bfield\n    column uint16[4] adc\n",
    )
    _git(repo, "commit", "-qam", "adc")
    _edit(repo, "main.soa", "column uint16[4] adc", "column uint16[4] adc packed")
    status, out, _ = run_cli("breaking", "--against", "HEAD")
    assert status == 1
    assert "`Hits.adc` changed from column to packed column" in out
    assert _changes()[1] == [("memory", "MEMBER_KIND_CHANGED", "schemas/main.soa", 9, 22)]


def test_dtype_change_of_same_size_pitch_is_still_reported(repo: Path) -> None:
    # int32 -> float32: identical offsets and pitches for every n, different bytes meaning.
    _edit(repo, "main.soa", "column int32 detector_id", "column float32 detector_id")
    assert _changes()[1] == [("memory", "MEMBER_DTYPE_CHANGED", "schemas/main.soa", 7, 12)]


def test_removals_point_into_the_old_schema(repo: Path) -> None:
    _edit(repo, "common.soa", "column float32 px, py, pz", "column float32 px, py")
    _edit(repo, "main.soa", "Tracks{px, py, pz}", "Tracks{px, py}")
    status, changes = _changes()
    assert status == 1
    assert changes == [
        ("source", "MEMBER_REMOVED", "HEAD:schemas/common.soa", 3, 28),
        ("memory", "MEMBER_OFFSET_CHANGED", "schemas/common.soa", 4, 18),
        ("source", "BINDING_BLOCK_CHANGED", "schemas/main.soa", 13, 24),
    ]
    _, out, _ = run_cli("breaking", "--against", "HEAD", "--color", "never")
    # The old line is shown, read from git, not the working tree's line 3.
    assert (
        "HEAD:schemas/common.soa:3:28: breaking[MEMBER_REMOVED]: source: column `Tracks.pz` was "
        "removed or renamed\n3 |     column float32 px, py, pz\n" in out
    )


def test_layout_renamed_and_moved(repo: Path) -> None:
    (repo / "schemas" / "common.soa").write_text("")
    _edit(repo, "main.soa", 'import "common.soa"\n', COMMON)
    assert _changes()[1] == [("source", "LAYOUT_MOVED", "schemas/main.soa", 2, 8)]
    _edit(repo, "main.soa", "Hits", "Hitz")
    status, changes = _changes()
    assert ("source", "LAYOUT_REMOVED", "HEAD:schemas/main.soa", 4, 8) in changes


def test_model_signature_changes(repo: Path) -> None:
    _edit(
        repo,
        "main.soa",
        "    input  momenta   = Tracks{px, py, pz} as [n, c]\n"
        "    input  positions = Hits{x, y, z}      as [n, c]\n"
        "    output ids       = Hits{detector_id}\n",
        "    input  positions = Hits{x, y, z}      as [c, n]\n"
        "    input  momenta   = Tracks{px, py, pz} as [n, c] contiguous\n"
        "    input  ids       = Hits{detector_id}\n"
        "    output charges   = Tracks{charge}\n",
    )
    assert _changes()[1] == [
        ("source", "BINDING_ORDER_CHANGED", "schemas/main.soa", 13, 12),
        ("source", "BINDING_AXES_CHANGED", "schemas/main.soa", 13, 46),
        ("source", "BINDING_CONTIGUOUS_CHANGED", "schemas/main.soa", 14, 53),
        ("source", "BINDING_DIRECTION_CHANGED", "schemas/main.soa", 15, 12),
        ("source", "BINDING_ADDED", "schemas/main.soa", 16, 12),
    ]


def test_same_n_and_whole_clauses(repo: Path) -> None:
    """A shared size changes what packages accept; `whole` changes how `batch_size` slices."""
    momenta = "    input  momenta   = Tracks{px, py, pz} as [n, c]"
    positions = "    input  positions = Hits{x, y, z}      as [n, c]"
    _edit(repo, "main.soa", positions, positions + " same n as momenta")
    assert _changes()[1] == [
        ("source", "BINDING_SAME_N_CHANGED", "schemas/main.soa", 14, len(positions) + 12)
    ]
    _, out, _ = run_cli("breaking", "--against", "HEAD", "--color", "never")
    assert "`VertexFinder.positions` shares the n of `momenta`, was no other input's n" in out
    _git(repo, "commit", "-q", "-am", "v2")
    _edit(repo, "main.soa", "same n as momenta", "whole")
    _edit(repo, "main.soa", momenta, momenta + " whole")
    assert _changes()[1] == [
        ("source", "BINDING_WHOLE_CHANGED", "schemas/main.soa", 13, len(momenta) + 2),
        ("source", "BINDING_SAME_N_CHANGED", "schemas/main.soa", 14, 12),
        ("source", "BINDING_WHOLE_CHANGED", "schemas/main.soa", 14, len(positions) + 2),
    ]
    _, out, _ = run_cli("breaking", "--against", "HEAD", "--color", "never")
    assert "`VertexFinder.momenta` is passed whole by `batch_size` calls, was sliced" in out
    assert "`VertexFinder.positions` shares no other input's n, was the n of `momenta`" in out


def test_imports_are_read_at_the_ref(repo: Path) -> None:
    """Old main.soa imports the old common.soa: a working-tree import would hide this change."""
    _edit(repo, "common.soa", "column int16 charge", "column int16 charge, spare")
    assert _changes("schemas/main.soa")[1] == [
        ("memory", "MEMBER_ADDED", "schemas/common.soa", 4, 26)
    ]


def test_removed_file_and_other_refs(repo: Path) -> None:
    (repo / "schemas" / "extra.soa").write_text("/// E.\nlayout Extra {\n    column int8 e\n}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "v2")
    (repo / "schemas" / "extra.soa").unlink()
    assert _changes()[1] == [("source", "LAYOUT_REMOVED", "HEAD:schemas/extra.soa", 2, 8)]
    status, out, _ = run_cli("breaking", "--against", "HEAD~1")
    assert status == 0, out


def test_memory_findings_agree_with_the_layout_engine(repo: Path) -> None:
    """Whatever the edit, bytes differ for some n exactly when a memory change is reported."""
    edits = [
        ("column float32 x, y, z", "column float32 x, y, z\n    column float32 w"),
        (
            "column int32 detector_id\n    scalar float32 bfield",
            "scalar float32 bfield\n    column int32 detector_id",
        ),
        ("column int32 detector_id", "column int32 detector_id, extra"),
        ("scalar float32 bfield", "scalar float64 bfield"),
        ("align 128", "align 256"),
        ("/// Hits.", "/// Hits, documented."),
    ]
    old = load(repo / "schemas" / "main.soa").unwrap().layouts["Hits"]
    for before, after in edits:
        _edit(repo, "main.soa", before, after)
        new = load(repo / "schemas" / "main.soa").unwrap().layouts["Hits"]
        differs = any(
            byte_size(old).evaluate(n, old.align) != byte_size(new).evaluate(n, new.align)
            or {k: v.evaluate(n, old.align) for k, v in member_offsets(old).items()}
            != {
                k: v.evaluate(n, new.align)
                for k, v in member_offsets(new).items()
                if k in member_offsets(old)
            }
            or [(m.name, m.dtype_name, m.kind) for m in old.members]
            != [(m.name, m.dtype_name, m.kind) for m in new.members if old.member(m.name)]
            for n in range(0, 300)
        )
        memory = [c for c in _changes()[1] if c[0] == "memory"]
        assert bool(memory) == differs, (before, after, memory)
        _edit(repo, "main.soa", after, before)


def test_usage_errors(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    status, _, err = run_cli("breaking", "--against", "no-such-ref")
    assert status == 2 and "unknown git ref `no-such-ref`" in err
    assert run_cli("breaking", "--against", "HEAD", "nowhere")[0] == 2
    assert run_cli("breaking")[0] == 2  # --against is required
    outside = tmp_path_factory.mktemp("not_a_repo")
    os.chdir(outside)
    status, _, err = run_cli("breaking", "--against", "HEAD")
    assert status == 2 and "not inside a git repository" in err


def test_schema_errors_stop_the_comparison(repo: Path) -> None:
    _edit(repo, "main.soa", "column int32 detector_id", "column int33 detector_id")
    status, out, err = run_cli("breaking", "--against", "HEAD", "--color", "never")
    assert status == 1
    assert "schemas/main.soa:7:12: error[SOA101]: unknown dtype `int33`" in err


def test_github_format(repo: Path) -> None:
    _edit(repo, "main.soa", "column int32 detector_id", "column int64 detector_id")
    status, out, _ = run_cli("breaking", "--against", "HEAD", "--format", "github")
    assert status == 1
    # int64 pitches differ from int32 ones from n = 17 on (17 * 8 bytes > 128): bfield moves.
    assert out.splitlines() == [
        "::error file=schemas/main.soa,line=7,col=12,endLine=7,endColumn=17,"
        "title=soagen MEMBER_DTYPE_CHANGED::dtype of `Hits.detector_id` changed from int32 to int64",
        "::error file=schemas/main.soa,line=8,col=20,endLine=8,endColumn=26,"
        "title=soagen MEMBER_OFFSET_CHANGED::`Hits.bfield` moved from byte 512 to byte 640 "
        "(at n = 17) (a member before it was added, removed, reordered or resized)",
    ]
