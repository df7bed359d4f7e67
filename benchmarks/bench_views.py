"""How long building a model block takes: soagen's accessors against a bare `as_strided` and a gather.

For each n it times, per call (median of several samples):
- a bare `Tensor.as_strided` with precomputed sizes, strides and offset: the floor for any view;
- the generated accessors: `nodes.block("node_features")`, `nodes.block(BlockSpec)`, a member
  property (`nodes.x`) and a slice's block (`nodes[a:b].block(...)`, which builds the slice too);
- gathering the same four columns into a new [n, 4] tensor with `torch.stack` and `np.stack`, which is
  what code without a strided view has to do.

It prints a Markdown table with medians and ratios to the bare `as_strided`. Run from the repository
root: `python benchmarks/bench_views.py` (n = 1e3 and 1e7), or `--quick` (n = 1e3 and 1e5, fewer
samples) for a smoke run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generated.gnn import Nodes  # noqa: E402


def per_call(action: Callable[[], object], samples: int, min_sample_s: float) -> float:
    """Median seconds per call over `samples` samples of enough calls to last `min_sample_s`."""
    calls = 1
    while True:  # find a call count whose sample lasts long enough for the clock
        start = time.perf_counter()
        for _ in range(calls):
            action()
        elapsed = time.perf_counter() - start
        if elapsed >= min_sample_s or calls >= 1 << 22:
            break
        calls *= 2
    timings = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(calls):
            action()
        timings.append((time.perf_counter() - start) / calls)
    return statistics.median(timings)


def cases(n: int, device: str) -> dict[str, Callable[[], object]]:
    nodes = Nodes.allocate(n, device=device)
    for name in ("x", "y", "z", "energy"):
        nodes.member(name).normal_()
    spec = Nodes.BLOCKS["node_features"]
    geometry = spec.view(n)
    base = nodes.buffer.view(torch.float32)
    size, stride, offset = geometry.shape, geometry.strides, geometry.offset // 4
    half = n // 2
    found: dict[str, Callable[[], object]] = {
        "bare as_strided": lambda: base.as_strided(size, stride, offset),
        'nodes.block("node_features")': lambda: nodes.block("node_features"),
        "nodes.block(BlockSpec)": lambda: nodes.block(spec),
        "nodes.x (member property)": lambda: nodes.x,
        "nodes[0:n/2].block(...) (slice + block)": lambda: nodes[0:half].block("node_features"),
        "torch.stack gather": lambda: torch.stack([nodes.x, nodes.y, nodes.z, nodes.energy], dim=1),
    }
    if device == "cpu":
        columns = [nodes.numpy(name) for name in ("x", "y", "z", "energy")]
        found["np.stack gather"] = lambda: np.stack(columns, axis=1)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="n = 1e3 and 1e5, fewer samples")
    parser.add_argument("--device", default="cpu", help="torch device to allocate on (default cpu)")
    parser.add_argument("--samples", type=int, default=None, help="samples per case (default 15)")
    args = parser.parse_args(argv)
    sizes = [1_000, 100_000] if args.quick else [1_000, 10_000_000]
    samples = args.samples or (5 if args.quick else 15)
    min_sample_s = 0.002 if args.quick else 0.02
    synchronize = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        results[n] = {}
        for name, action in cases(n, args.device).items():

            def timed(action: Callable[[], object] = action) -> None:
                action()
                synchronize()

            results[n][name] = per_call(timed, samples, min_sample_s)

    print(
        f"torch {torch.__version__}, device {args.device}, median of {samples} samples per case\n"
    )
    header = "| operation | " + " | ".join(f"n={n:.0e}: median | ratio" for n in sizes) + " |"
    header = header.replace("e+0", "e").replace("e+", "e")
    print(header)
    print("|---|" + "---:|---:|" * len(sizes))
    for name in results[sizes[0]]:
        cells = []
        for n in sizes:
            median = results[n][name]
            ratio = median / results[n]["bare as_strided"]
            cells.append(f"{median * 1e6:,.2f} µs | {ratio:,.2f}x")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
