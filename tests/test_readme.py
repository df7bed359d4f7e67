"""README's promises that CI can hold it to."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_running_models_snippet_runs(tmp_path: Path, gnn_build: tuple[Path, str, str]) -> None:
    """The README's first model snippet, as written, with its files in a temporary folder."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Running models", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    snippet = snippet.replace('"edge_classifier.pt2"', repr(str(gnn_build[0])))
    snippet = snippet.replace('"edge_classifier.pt"', repr(str(tmp_path / "edge_classifier.pt")))
    namespace: dict[str, object] = {}
    exec(compile(snippet, "README.md (Running models)", "exec"), namespace)
    scores = namespace["scores"]
    values = scores.score  # type: ignore[attr-defined]
    assert values.shape == (100_000,)
    # The reference: a model built anew, run eagerly on plain tensors gathered member by member
    # from the collections the snippet filled (no block, no binding, no package).
    import torch

    from examples.gnn_model import build_model

    nodes, edges = namespace["nodes"], namespace["edges"]
    node_features = torch.stack([nodes.x, nodes.y, nodes.z, nodes.energy], dim=1).clone()  # type: ignore[attr-defined]
    edge_index = torch.stack([edges.src, edges.dst]).clone()  # type: ignore[attr-defined]
    edge_features = torch.stack([edges.delta_r, edges.delta_eta], dim=1).clone()  # type: ignore[attr-defined]
    with torch.no_grad():
        expected = build_model()(node_features, edge_index, edge_features)
    assert float(expected.std()) > 0.01  # the scores vary: agreeing with them means something
    torch.testing.assert_close(values, expected, rtol=1e-4, atol=1e-5)
