"""Run the example edge classifier on one synthetic event held in SoA collections.

    python -m examples.run_gnn                       # eager, TorchScript and torch.compile, CPU
    python -m examples.run_gnn --package edge_classifier.pt2   # and AOT, from `soagen compile`
    python -m examples.run_gnn --backend eager       # one backend (repeatable)

The collections are filled as a C++ producer would fill them; the model reads zero-copy views of their
buffers and writes its scores into an `EdgeScores` collection. Every backend's scores are checked
against the eager model on gathered contiguous tensors.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Sequence

import torch

from examples.gnn_model import build_model
from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes
from soagen.runtime import ensure_cpu_settings


def make_event(n_nodes: int, n_edges: int, device: str, seed: int = 0) -> tuple[Nodes, Edges]:
    """Nodes and edges with random features, written column by column into their buffers."""
    generator = torch.Generator().manual_seed(seed)
    nodes, edges = Nodes.allocate(n_nodes, device=device), Edges.allocate(n_edges, device=device)
    for column in ("x", "y", "z", "energy"):
        nodes.member(column).copy_(torch.randn(n_nodes, generator=generator))
    nodes.bfield.fill_(3.8)
    edges.src.copy_(torch.randint(0, n_nodes, (n_edges,), generator=generator))
    edges.dst.copy_(torch.randint(0, n_nodes, (n_edges,), generator=generator))
    edges.delta_r.copy_(torch.rand(n_edges, generator=generator))
    edges.delta_eta.copy_(torch.randn(n_edges, generator=generator))
    return nodes, edges


def reference(nodes: Nodes, edges: Edges) -> torch.Tensor:
    """What users do today: gather the columns into new contiguous tensors, then run the model."""
    net = build_model().to(nodes.device)
    with torch.inference_mode():
        scores: torch.Tensor = net(
            torch.stack([nodes.x, nodes.y, nodes.z, nodes.energy], dim=1),
            torch.stack([edges.src, edges.dst]),
            torch.stack([edges.delta_r, edges.delta_eta], dim=1),
        )
    return scores


def binding_for(backend: str, package: str | None) -> EdgeClassifier:
    if backend == "aot":
        if package is None:
            raise SystemExit(
                "--backend aot needs --package: build one with `soagen compile schemas/gnn.soa "
                "--model EdgeClassifier --factory examples/gnn_model.py:build_model -o "
                "edge_classifier.pt2`"
            )
        return EdgeClassifier.load(package)
    net = build_model()
    # The model's torch.cat of its node rows with the edge features runs ~11% slower on the
    # column-major [E, 2] view than on a row-major copy, which costs less: eager and TorchScript
    # get one copy per call. torch.compile and AOT fuse the concatenation and read the view as is.
    row_major = ["edge_features"] if backend in ("eager", "torchscript") else []
    model = torch.jit.script(net) if backend == "torchscript" else net
    return EdgeClassifier(model, backend=backend, contiguous=row_major)


def _best_of(repeat: int, action: Callable[[], object]) -> float:
    """The fastest of `repeat` timed calls, in seconds."""
    times = []
    for _ in range(max(1, repeat)):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        action="append",
        choices=["eager", "torchscript", "compile", "aot"],
        help="repeatable; default: eager, torchscript, compile, and aot with --package",
    )
    parser.add_argument("--package", help="the .pt2 file for --backend aot")
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=100_000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    if torch.device(args.device).type == "cpu":
        # soagen applies its CPU settings (threads, malloc) at its first CPU call: apply them now,
        # so the gather path below runs under the same settings as every soagen path.
        ensure_cpu_settings()
    nodes, edges = make_event(args.nodes, args.edges, args.device)
    expected = reference(nodes, edges)
    print(
        f"event: {nodes.size} nodes ({nodes.nbytes} bytes), {edges.size} edges "
        f"({edges.nbytes} bytes) on {nodes.device}\n"
    )
    gathered = _best_of(args.repeat, lambda: reference(nodes, edges))
    print("| path | first call (ms) | per call (ms) | vs gather + eager |")
    print("|---|---:|---:|---:|")
    print(f"| gather columns + eager (today) | | {gathered * 1e3:.2f} | 1.00 |")
    default = ["eager", "torchscript", "compile"] + (["aot"] if args.package else [])
    for backend in args.backend or default:
        model = binding_for(backend, args.package)
        scores = EdgeScores.allocate(edges.size, device=edges.device)
        started = time.perf_counter()
        model(nodes, edges, out=scores)  # the first call places (and for `compile`, compiles)
        first = time.perf_counter() - started
        best = _best_of(args.repeat, functools.partial(model, nodes, edges, out=scores))
        torch.testing.assert_close(scores.score, expected, rtol=1e-4, atol=1e-5)
        print(
            f"| soagen {backend} | {first * 1e3:.1f} | {best * 1e3:.2f} | {best / gathered:.2f} |"
        )
    print("\nevery backend's scores match the eager model on gathered tensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
