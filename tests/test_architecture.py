"""The parts of soagen import one another only as `pyproject.toml`'s contracts allow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Every contract was checked, none skipped for a missing module.
    assert "4 kept, 0 broken" in result.stdout, result.stdout


def test_a_broken_contract_fails(tmp_path: Path) -> None:
    """The checker really fails on an import against the layers: the contract is not vacuous."""
    config = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    # Claim the runtime sits above the build: build -> runtime imports then break the layers.
    broken = config.replace(
        '    "soagen.build",\n    "soagen.runtime | soagen.tools | soagen.generator",',
        '    "soagen.runtime | soagen.tools | soagen.generator",\n    "soagen.build",',
    )
    assert broken != config
    (tmp_path / "pyproject.toml").write_text(broken, encoding="utf-8")
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache", str(tmp_path / "pyproject.toml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "soagen.build" in result.stdout and "BROKEN" in result.stdout


def test_torch_free_parts_import_without_torch() -> None:
    """Importing the language, generator, tooling and command line loads neither torch nor NumPy;
    importing the runtime loads neither until a collection touches memory."""
    code = (
        "import sys, soagen.dsl.loader, soagen.dsl.check, soagen.generator.python, "
        "soagen.tools.lint, soagen.tools.fmt, soagen.tools.breaking, soagen.cli, soagen.runtime;"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
