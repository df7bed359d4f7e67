"""README's promises that CI can hold it to."""

from __future__ import annotations

import re

from .helpers import REPO


def _quick_start_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_quick_start_has_two_commands_and_ci_runs_the_test_one() -> None:
    commands = _quick_start_commands()
    assert len(commands) == 2
    assert "soagen schemas/gnn.soa" in commands[0]
    assert "python -m examples.run_gnn" in commands[0]
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == commands[1]
