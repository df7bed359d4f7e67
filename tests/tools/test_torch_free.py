"""The schema tooling runs where torch and NumPy cannot be imported (pre-commit hooks install soagen
without them): each command runs in a subprocess whose `import torch` and `import numpy` fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

# As Python reports a package that is not installed.
BLOCKER = 'raise ModuleNotFoundError("No module named {name!r} (blocked)", name={name!r})\n'


@pytest.fixture(scope="module")
def torchless_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    blocked = tmp_path_factory.mktemp("blocked")
    for name in ("torch", "numpy"):
        (blocked / name).mkdir()
        (blocked / name / "__init__.py").write_text(BLOCKER.format(name=name))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocked), str(REPO)])
    return env


def _soagen(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "soagen", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_blocker_blocks(torchless_env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import torch"], env=torchless_env, capture_output=True, text=True
    )
    assert result.returncode == 1 and "No module named 'torch' (blocked)" in result.stderr


def test_tooling_commands_run_without_torch(torchless_env: dict[str, str], tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    schema = schemas / "gnn.soa"
    schema.write_text((REPO / "schemas" / "gnn.soa").read_text())
    env = torchless_env

    generated = _soagen(env, tmp_path, "schemas/gnn.soa")
    assert generated.returncode == 0, generated.stderr
    assert (tmp_path / "generated" / "gnn.py").is_file()
    checked = _soagen(env, tmp_path, "check", "schemas")
    assert checked.returncode == 0 and "up to date" in checked.stdout, checked.stderr
    shown = _soagen(env, tmp_path, "show", "schemas/gnn.soa", "--size", "10")
    assert shown.returncode == 0 and "Nodes" in shown.stdout, shown.stderr
    ir = _soagen(env, tmp_path, "show", "schemas/gnn.soa", "--ir")
    assert ir.returncode == 0 and "model EdgeClassifier" in ir.stdout, ir.stderr
    linted = _soagen(env, tmp_path, "lint", "schemas", "--select", "BASIC")
    assert linted.returncode in (0, 1) and "Traceback" not in linted.stderr, linted.stderr
    formatted = _soagen(env, tmp_path, "fmt", "--check", "schemas")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    explained = _soagen(env, tmp_path, "explain", "SOA303")
    assert explained.returncode == 0 and "SOA303" in explained.stdout, explained.stderr
    header = REPO / "tests" / "cmssw_headers" / "Tracks.h"
    imported = _soagen(env, tmp_path, "import-cmssw", str(header), "-o", "imported")
    assert imported.returncode == 0 and (tmp_path / "imported" / "Tracks.soa").is_file(), (
        imported.stderr
    )

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "schemas"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "schema"], cwd=tmp_path, check=True)
    schema.write_text(schema.read_text().replace("align 128", "align 64", 1))
    broken = _soagen(env, tmp_path, "breaking", "--against", "HEAD", "schemas")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "Traceback" not in broken.stderr
    assert "LAYOUT_ALIGN_CHANGED" in broken.stdout, broken.stdout


def test_commands_that_need_torch_say_so(torchless_env: dict[str, str], tmp_path: Path) -> None:
    schema = tmp_path / "gnn.soa"
    schema.write_text((REPO / "schemas" / "gnn.soa").read_text())
    result = _soagen(
        torchless_env,
        tmp_path,
        "compile",
        "gnn.soa",
        "--model",
        "EdgeClassifier",
        "--factory",
        "model.py:build",
        "-o",
        "out.pt2",
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "compile needs torch" in result.stderr and "Traceback" not in result.stderr
