"""Shell completion scripts, exercised in a real bash; and an example in every command's --help."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from soagen.cli.main import COMMANDS
from tests.helpers import run_cli


def _script(shell: str) -> str:
    status, out, err = run_cli("completion", shell)
    assert status == 0, err
    return out


def _complete(script: Path, words: list[str], cwd: Path) -> list[str]:
    """What bash offers for the last word, calling the function as `complete -F` would."""
    quoted = " ".join(f"'{w}'" for w in words)
    code = (
        f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
        '_soagen_complete; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    result = subprocess.run(
        ["bash", "-c", code], cwd=cwd, capture_output=True, text=True, check=True
    )
    return sorted(line for line in result.stdout.splitlines() if line)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_options_choices_codes_and_schemas(tmp_path: Path) -> None:
    script = tmp_path / "soagen.bash"
    script.write_text(_script("bash"))
    (tmp_path / "a.soa").write_text("")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "schemas").mkdir()
    assert _complete(script, ["soagen", "l"], tmp_path) == ["lint"]
    assert _complete(script, ["soagen", "br"], tmp_path) == ["breaking"]
    assert _complete(script, ["soagen", "lint", "--format", ""], tmp_path) == [
        "github",
        "json",
        "text",
    ]
    assert _complete(script, ["soagen", "fmt", "--c"], tmp_path) == ["--check", "--color"]
    assert _complete(script, ["soagen", "completion", "z"], tmp_path) == ["zsh"]
    assert _complete(script, ["soagen", "explain", "LAYOUT_"], tmp_path) == [
        "LAYOUT_ALIGN_CHANGED",
        "LAYOUT_DOC_COMMENT",
        "LAYOUT_MOVED",
        "LAYOUT_PASCAL_CASE",
        "LAYOUT_REMOVED",
        "LAYOUT_SIZE_CHANGED",
        "LAYOUT_UNUSED",
    ]
    # Schemas: .soa files and folders, nothing else.
    assert _complete(script, ["soagen", "lint", ""], tmp_path) == ["a.soa", "schemas"]
    assert _complete(script, ["soagen", "generate", "-o", ""], tmp_path) == ["schemas"]
    # Headers: C++ headers and folders.
    (tmp_path / "HitsSoA.h").write_text("")
    (tmp_path / "Tracks.hpp").write_text("")
    assert _complete(script, ["soagen", "import-cmssw", ""], tmp_path) == [
        "HitsSoA.h",
        "Tracks.hpp",
        "schemas",
    ]
    assert _complete(script, ["soagen", "lint", ""], tmp_path) == ["a.soa", "schemas"]


def test_every_command_is_in_every_script() -> None:
    for shell in ("bash", "zsh", "fish"):
        script = _script(shell)
        for command in COMMANDS:
            assert command in script, (shell, command)
        assert "--against" in script or "against" in script
        assert "github" in script


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_parse(shell: str, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    path = tmp_path / f"soagen.{shell}"
    path.write_text(_script(shell))
    flag = "-n" if shell == "zsh" else "--no-execute"
    subprocess.run([shell, flag, str(path)], check=True)


def test_unknown_shell_is_a_usage_error() -> None:
    assert run_cli("completion", "tcsh")[0] == 2


@pytest.mark.parametrize("command", ["lint", "fmt", "breaking", "completion", "explain"])
def test_help_shows_an_example(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "soagen", command, "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "example:\n  " in result.stdout
    assert f"soagen {command}" in result.stdout.split("example:", 1)[1]


def test_main_help_lists_every_example() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "soagen", "--help"], capture_output=True, text=True
    )
    for snippet in ("soagen lint", "soagen fmt -w", "soagen breaking --against", "completion bash"):
        assert snippet in result.stdout
