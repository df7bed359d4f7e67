"""The pre-commit hooks as a user gets them: `pre-commit try-repo` on this checkout.

The hook environment is built from this checkout (soagen without torch) with pip, so this test needs
PyPI, as CI has. One environment build: both files go through one `try-repo` run.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli

pytest.importorskip("pre_commit")

BAD = """layout hits {
    column float32 x, y
}
"""

GOOD = """/// Hits of a tracker.
layout Hits {
    column float32 x, y
}

/// Scores hits.
model Scorer {
    input  positions = Hits{x, y} as [n, c]
    output scores    = Hits{x}
}
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def _snapshot(into: Path) -> Path:
    """This checkout as it is now (tracked and new files, not ignored ones), committed in a new
    repository: try-repo would otherwise leave out files that are not committed yet."""
    listing = _git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in filter(None, listing.split("\0")):
        source = REPO / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    _git(into, "init", "-q")
    _git(into, "add", "-A")
    _git(into, "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-q", "-m", "s")
    return into


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_lint_hook_rejects_a_bad_schema_and_passes_a_good_one(tmp_path: Path) -> None:
    hooks = _snapshot(tmp_path / "soagen")
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    (project / "bad.soa").write_text(BAD)
    (project / "good.soa").write_text(GOOD)
    _git(project, "add", "-A")
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(hooks), "soagen-lint"]
        + ["--color", "never", "--files", "bad.soa", "good.soa"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "soagen lint" in output and "Failed" in output
    assert "bad.soa:1:8: error[LAYOUT_PASCAL_CASE]: layout `hits` is not PascalCase" in output
    assert "bad.soa:1:8: error[LAYOUT_DOC_COMMENT]" in output
    # Both files were linted in the one run, and the good one has nothing to say.
    assert "findings in 2 files" in output
    assert "good.soa" not in output

    # The C++ check hook, from the same hook environment: stale headers fail it, fresh ones pass.
    (project / "schemas").mkdir()
    (project / "schemas" / "good.soa").write_text(GOOD)
    _git(project, "add", "-A")

    def check_cpp() -> tuple[int, str]:
        ran = subprocess.run(
            [sys.executable, "-m", "pre_commit", "try-repo", str(hooks), "soagen-check-cpp"]
            + ["--color", "never", "--all-files"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return ran.returncode, ran.stdout + ran.stderr

    status, output = check_cpp()
    assert status == 1 and "generated/good.h" in output, output
    with contextlib.chdir(project):
        assert run_cli("generate", "--lang", "cpp", "schemas", "-o", "generated")[0] == 0
    _git(project, "add", "-A")
    status, output = check_cpp()
    assert status == 0 and "Passed" in output, output
