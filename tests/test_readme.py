"""README's promises that CI can hold it to."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO


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
    for written, here in (
        ('"build/edge_classifier.pt2"', gnn_build[0]),
        ('"edge_classifier.pt"', tmp_path / "edge_classifier.pt"),
    ):
        assert written in snippet, written
        snippet = snippet.replace(written, repr(str(here)))
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


def test_every_package_path_is_the_one_quick_start_writes() -> None:
    """A reader who ran Quick start has `build/edge_classifier.pt2`: the README's later examples
    load and serve that file, not one of the same name elsewhere."""
    written = re.findall(r"-o (\S+\.pt2)", _quick_start_commands()[0])
    assert written == ["build/edge_classifier.pt2"]
    text = (REPO / "README.md").read_text()
    paths = set(re.findall(r"[\w./-]*edge_classifier\.pt2", text))
    assert paths == set(written), paths


def test_aligned_memory_snippet_runs() -> None:
    """The README's snippet that wraps NumPy memory from `aligned_numpy`, and its numbers."""
    import numpy as np

    from generated.gnn import Edges, Nodes

    text = (REPO / "README.md").read_text()
    section = text.split("## Running models", 1)[1].split("\n## ", 1)[0]
    snippets = re.findall(r"```python\n(.+?)```", section, re.S)
    snippet = next(s for s in snippets if "aligned_numpy" in s)
    namespace: dict[str, object] = {}
    exec(compile(snippet, "README.md (aligned_numpy)", "exec"), namespace)
    nodes, array = namespace["nodes"], namespace["array"]
    assert isinstance(array, np.ndarray) and array.ctypes.data % Nodes.ALIGNMENT == 0
    assert nodes.buffer.data_ptr() == array.ctypes.data  # type: ignore[attr-defined]
    # The runs of element counts with one byte size that the text gives.
    assert {Nodes.byte_size(n) for n in range(1, 33)} == {1920} != {Nodes.byte_size(33)}
    assert {Edges.byte_size(n) for n in range(1, 17)} == {512} != {Edges.byte_size(17)}
    for sentence in ("1920 bytes for each n from 1 to 32", "512 for each n from 1 to 16"):
        assert sentence in " ".join(section.split())


def test_the_cpu_build_note_pins_the_torch_of_quick_start() -> None:
    """The way to the CPU build installs the very torch Quick start pins, from PyTorch's CPU
    index, and the README says the CUDA build works too."""
    text = (REPO / "README.md").read_text()
    section = " ".join(text.split("## Quick start", 1)[1].split("\n## ", 1)[0].split())
    pins = {
        pin for command in _quick_start_commands() for pin in re.findall(r"torch==\S+", command)
    }
    assert len(pins) == 1, pins
    cpu = re.search(
        r"pip install (torch==\S+) --index-url https://download.pytorch.org/whl/cpu", section
    )
    assert cpu is not None and cpu.group(1) in pins
    assert "CUDA build" in section and "Both work" in section


def test_cpp_example_is_the_generated_header() -> None:
    """README's C++ example is what `soagen generate --lang cpp schemas/gnn.soa` writes."""
    from soagen.dsl.loader import load
    from soagen.generator.cpp import generate_cpp

    text = (REPO / "README.md").read_text()
    section = text.split("### `soagen generate --lang cpp`", 1)[1].split("\n### ", 1)[0]
    shown = re.findall(r"```cpp\n(.+?)```", section, re.DOTALL)
    assert shown == [generate_cpp(load("schemas/gnn.soa").unwrap())["gnn"]]
