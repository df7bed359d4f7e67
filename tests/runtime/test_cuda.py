"""CUDA: AOTInductor packages compiled for the GPU, run where the data lives; the queued index check.

Skipped without a CUDA device (CI has none); run on a lent GPU machine with `pytest tests/runtime/test_cuda.py`.
Two GNN packages are compiled once per module (AOTInductor for CUDA takes about a minute each):
one that returns its results and one built with `write_outputs=True`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

from soagen.build.compile import compile_model  # noqa: E402
from tests.helpers import REPO, assert_no_host_device_copies  # noqa: E402

GNN_SCHEMA = REPO / "schemas" / "gnn.soa"
GNN_FACTORY = "examples/gnn_model.py:build_model"
# (nodes, edges): one element, a few, and counts off every alignment multiple.
SIZES = [(1, 1), (3, 2), (40, 129), (300, 1000), (2_001, 50_003)]


@pytest.fixture(scope="module")
def gnn() -> ModuleType:
    """The checked-in module generated from schemas/gnn.soa."""
    import generated.gnn

    return generated.gnn


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cuda_packages")
    return {
        variant: compile_model(
            GNN_SCHEMA,
            "EdgeClassifier",
            str(REPO / GNN_FACTORY),
            output=root / f"{variant}.pt2",
            device="cuda",
            write_outputs=variant == "write",
        )
        for variant in ("returns", "write")
    }


@pytest.fixture(scope="module")
def net() -> torch.nn.Module:
    from examples.gnn_model import build_model

    return build_model().cuda()


def _inputs(gnn: ModuleType, n_nodes: int, n_edges: int, seed: int) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(seed)
    nodes = gnn.Nodes.allocate(n_nodes, device="cuda", zero=True)
    edges = gnn.Edges.allocate(n_edges, device="cuda", zero=True)
    nodes.block("node_features").copy_(torch.randn(n_nodes, 4, generator=generator))
    edges.block("edge_index").copy_(torch.randint(0, n_nodes, (2, n_edges), generator=generator))
    edges.block("edge_features").copy_(torch.randn(n_edges, 2, generator=generator))
    return nodes, edges


def _eager(net: torch.nn.Module, nodes: Any, edges: Any) -> torch.Tensor:
    with torch.no_grad():
        result: torch.Tensor = net(
            nodes.block("node_features").contiguous(),
            edges.block("edge_index").contiguous(),
            edges.block("edge_features").contiguous(),
        )
    return result


@pytest.mark.parametrize("variant", ["returns", "write"])
def test_cuda_package_matches_eager_at_every_size_and_on_slices(
    gnn: ModuleType, packages: dict[str, Path], net: torch.nn.Module, variant: str
) -> None:
    model = gnn.EdgeClassifier.load(packages[variant])
    assert model._backend.writes_outputs == (variant == "write")
    for seed, (n_nodes, n_edges) in enumerate(SIZES):
        nodes, edges = _inputs(gnn, n_nodes, n_edges, seed)
        scores = gnn.EdgeScores.allocate(n_edges, device="cuda", zero=True)
        model(nodes, edges, out=scores)
        torch.testing.assert_close(scores.score, _eager(net, nodes, edges), rtol=1e-4, atol=1e-5)
    # A slice keeps its parent's pitches: the package reads them from the views.
    nodes, edges = _inputs(gnn, 300, 1000, seed=9)
    part = edges.slice(128, 640)
    scores = gnn.EdgeScores.allocate(part.size, device="cuda", zero=True)
    model(nodes, part, out=scores)
    torch.testing.assert_close(scores.score, _eager(net, nodes, part), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["returns", "write"])
def test_cuda_package_copies_nothing_between_host_and_device_and_takes_a_stream(
    gnn: ModuleType, packages: dict[str, Path], net: torch.nn.Module, variant: str
) -> None:
    model = gnn.EdgeClassifier.load(packages[variant])
    nodes, edges = _inputs(gnn, 2_000, 20_000, seed=4)
    scores = gnn.EdgeScores.allocate(edges.size, device="cuda", zero=True)
    model(nodes, edges, out=scores)  # loads the package on this GPU
    pointers = [nodes.buffer.data_ptr(), edges.buffer.data_ptr(), scores.buffer.data_ptr()]
    scores.score.zero_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the zeroing above comes first
    assert_no_host_device_copies(lambda: model(nodes, edges, out=scores, stream=stream), stream)
    assert [nodes.buffer.data_ptr(), edges.buffer.data_ptr(), scores.buffer.data_ptr()] == pointers
    torch.testing.assert_close(scores.score, _eager(net, nodes, edges), rtol=1e-4, atol=1e-5)


def test_cpu_package_refuses_cuda_collections(gnn: ModuleType, tmp_path: Path) -> None:
    from soagen.runtime.errors import ModelLoadError

    package = compile_model(
        GNN_SCHEMA,
        "EdgeClassifier",
        str(REPO / GNN_FACTORY),
        output=tmp_path / "cpu.pt2",
        device="cpu",
    )
    nodes, edges = _inputs(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100, device="cuda")
    with pytest.raises(ModelLoadError, match="compiled for cpu; it cannot run on cuda"):
        gnn.EdgeClassifier.load(package)(nodes, edges, out=scores)


BAD_INDEX_PROGRAM = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes
    nodes, edges = Nodes.allocate(30, device="cuda"), Edges.allocate(100, device="cuda")
    edges.block("edge_index").copy_(torch.randint(0, 30, (2, 100)))
    edges.src[7] = int(sys.argv[3])
    scores = EdgeScores.allocate(100, device="cuda")
    model = EdgeClassifier.load(sys.argv[2])  # the package brings edge_index's bound
    model(nodes, edges, out=scores)
    torch.cuda.synchronize()
    print("ran")
    """
)


@pytest.mark.parametrize("bad", [30, -1])
def test_cuda_index_check_stops_the_stream_on_a_bad_index(
    packages: dict[str, Path], bad: int
) -> None:
    # A device-side assert ends the CUDA context, so each case runs in its own process. Inductor's
    # kernels wrap -1 to the last node without a word: only soagen's queued check stops it.
    done = subprocess.run(
        [sys.executable, "-c", BAD_INDEX_PROGRAM, str(REPO), str(packages["returns"]), str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "ran" not in done.stdout
    assert "holds indices outside [0, n)" in done.stderr or "device-side assert" in done.stderr
    good = subprocess.run(
        [sys.executable, "-c", BAD_INDEX_PROGRAM, str(REPO), str(packages["returns"]), "29"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert good.returncode == 0 and "ran" in good.stdout, good.stderr


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.uint32])
def test_the_host_index_check_raises_for_gpu_indices_and_leaves_cuda_usable(
    gnn: ModuleType, dtype: torch.dtype
) -> None:
    # What a remote call on a GPU's data runs: the extremes are read back, no device-side assert.
    from soagen.runtime import IndexRangeError
    from soagen.runtime.model import _check_index_range

    binding = gnn.EdgeClassifier
    good = torch.tensor([[0, 1, 29], [2, 3, 4]], dtype=dtype, device="cuda")
    _check_index_range(binding, "edge_index", good, "node_features", 30, on_host=True)
    bad = good.clone()
    bad[1, 2] = 30
    with pytest.raises(IndexRangeError, match=r"outside \[0, 30\).*\(values 0\.\.30\)"):
        _check_index_range(binding, "edge_index", bad, "node_features", 30, on_host=True)
    assert float(torch.ones(3, device="cuda").sum()) == 3.0  # the context still works
