"""soagen's ONNX Runtime backend on a tagger-sized model, against ONNX Runtime on pre-made tensors.

The model is `benchmarks/models.py`'s DeepSetsTagger: per jet, 32 candidates of 16 features
(`[n, 16, 32]`, stored as CMSSW stores a column of Eigen 16x32 matrices) and their mask, five
class probabilities. It is exported as CMS exports its taggers (the TorchScript-based
`torch.onnx.export`, opset 17, a dynamic batch axis), and `soagen compile -o X.onnx` writes the
storage-order file. Paths, each checked against `ort pre-made` before it is timed:

- `ort pre-made`: ONNX Runtime through IO binding on contiguous `[n, 16, 32]` / `[n, 1, 32]`
  tensors made before the timing, writing a contiguous result: the model alone, the floor;
- `gather + ort`: what a user does without soagen: contiguous copies of the blocks, a fresh IO
  binding on them and on a result tensor, the run, the result copied into the output block;
- `soagen onnxruntime` (staged outputs, the default), `soagen onnxruntime in place`,
  `soagen onnxruntime compiled` (the `soagen compile -o X.onnx` file): the generated binding
  called on the collections;
- `soagen eager`: the same model by soagen's eager torch backend, for the choice of backend.

Repeats are interleaved (every path once per round, the first path rotating) and each sample runs
enough calls to last `--min-sample-ms`; the table gives medians in ms and each path's ratio to
`ort pre-made`. One intra-op thread everywhere, as in a reconstruction job.

    python benchmarks/bench_onnx.py                  # n = 1e2 .. 1e4, ~2 min
    python benchmarks/bench_onnx.py --sizes 100 --repeats 2 --min-sample-ms 5   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_models import generated_module, ort_session  # noqa: E402
from benchmarks.models import build_tagger  # noqa: E402
from soagen.runtime import set_cpu_threads  # noqa: E402

SCHEMA = REPO / "benchmarks" / "schemas" / "tagger.soa"
FACTORY = f"{REPO / 'benchmarks' / 'models.py'}:build_tagger"
FLOOR = "ort pre-made"
# The targets: within 1.10x of the floor at n >= 1000, never slower than gathering.
TARGET_RATIO, TARGET_MIN_N = 1.10, 1000


def export_tagger(folder: Path) -> tuple[Path, Path]:
    """The tagger exported as CMS exports taggers, and `soagen compile`'s storage-order file."""
    from soagen.build.onnx_export import export_onnx

    net = build_tagger()
    exported = folder / "tagger.onnx"
    example = (torch.randn(4, 16, 32), torch.ones(4, 1, 32))
    torch.onnx.export(
        net,
        example,
        str(exported),
        dynamo=False,
        opset_version=17,
        input_names=["pf_features", "pf_mask"],
        output_names=["probabilities"],
        dynamic_axes={"pf_features": {0: "n"}, "pf_mask": {0: "n"}, "probabilities": {0: "n"}},
    )
    compiled = folder / "tagger-storage.onnx"
    export_onnx(SCHEMA, "DeepSetsTagger", FACTORY, output=compiled)
    return exported, compiled


def fill(module: Any, n: int, seed: int) -> tuple[Any, Any]:
    """n jets of random candidates (about 20 of the 32 slots real), and their score collection."""
    generator = torch.Generator().manual_seed(seed)
    jets = module.Jets.allocate(n)
    jets.block("pf_features").copy_(torch.randn(n, 16, 32, generator=generator))
    jets.block("pf_mask").copy_((torch.rand(n, 1, 32, generator=generator) < 0.6).float())
    return jets, module.JetScores.allocate(n, zero=True)


def paths_for(
    module: Any, exported: Path, compiled: Path, n: int
) -> tuple[dict[str, Callable[[], None]], dict[str, Callable[[], torch.Tensor]]]:
    """Every path at n, and what each leaves to compare: the output block, or the floor's result."""
    jets, scores = fill(module, n, seed=n)
    session = ort_session(exported.read_bytes())
    features = jets.block("pf_features").contiguous()
    mask = jets.block("pf_mask").contiguous()
    result = torch.empty(n, 5)
    names = [port.name for port in session.get_inputs()]
    (output_name,) = [port.name for port in session.get_outputs()]
    premade = session.io_binding()
    for name, tensor in zip(names, (features, mask), strict=True):
        premade.bind_input(name, "cpu", 0, np.float32, list(tensor.shape), tensor.data_ptr())
    premade.bind_output(output_name, "cpu", 0, np.float32, [n, 5], result.data_ptr())

    def ort_premade(held: tuple[torch.Tensor, ...] = (features, mask)) -> None:
        session.run_with_iobinding(premade)  # the binding holds addresses only: `held` the memory

    def gather_ort() -> None:
        copies = [jets.block("pf_features").contiguous(), jets.block("pf_mask").contiguous()]
        gathered = torch.empty(n, 5)
        binding = session.io_binding()
        for name, tensor in zip(names, copies, strict=True):
            binding.bind_input(name, "cpu", 0, np.float32, list(tensor.shape), tensor.data_ptr())
        binding.bind_output(output_name, "cpu", 0, np.float32, [n, 5], gathered.data_ptr())
        session.run_with_iobinding(binding)
        scores.block("probabilities").copy_(gathered)

    tagger = module.DeepSetsTagger
    loaded = {
        "soagen onnxruntime": tagger.load(exported),
        "soagen onnxruntime in place": tagger.load(
            exported, backend_options={"outputs": "in_place"}
        ),
        "soagen onnxruntime compiled": tagger.load(compiled),
        "soagen eager": tagger(build_tagger(), backend="eager"),
    }
    paths: dict[str, Callable[[], None]] = {FLOOR: ort_premade, "gather + ort": gather_ort}
    for name, model in loaded.items():
        paths[name] = lambda model=model: model(jets, out=scores)
    readers: dict[str, Callable[[], torch.Tensor]] = {
        name: (lambda: scores.block("probabilities")) for name in paths
    }
    readers[FLOOR] = lambda: result
    return paths, readers


def check(paths: dict[str, Callable[[], None]], readers: dict[str, Any], n: int) -> None:
    """Every path's result equals the floor's (after the output block was cleared)."""
    paths[FLOOR]()
    want = readers[FLOOR]().clone()
    for name, run in paths.items():
        if name == FLOOR:
            continue
        readers[name]().zero_()
        run()
        got = readers[name]()
        try:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        except AssertionError as error:
            raise SystemExit(f"n = {n}: {name} disagrees with {FLOOR}: {error}") from None


def timed(run: Callable[[], None], min_sample_s: float) -> tuple[float, int]:
    """(seconds per call, calls per sample): calls repeated until a sample lasts min_sample_s."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            run()
        taken = time.perf_counter() - start
        if taken >= min_sample_s or calls >= 1 << 16:
            return taken / calls, calls
        calls = max(calls * 2, int(calls * min_sample_s / max(taken, 1e-9)) + 1)


def measure(
    paths: dict[str, Callable[[], None]], repeats: int, min_sample_s: float
) -> dict[str, list[float]]:
    """Interleaved samples: each round runs every path once, starting one path later."""
    calls = {}
    for name, run in paths.items():
        for _ in range(3):  # warm-up: first-call checks, sessions, caches
            run()
        calls[name] = timed(run, min_sample_s)[1]
    names = list(paths)
    taken: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            start = time.perf_counter()
            for _ in range(calls[name]):
                paths[name]()
            taken[name].append((time.perf_counter() - start) / calls[name])
    return taken


def verdict(medians: dict[str, float], n: int) -> list[str]:
    """The targets at n, from the medians."""
    floor, gathered = medians[FLOOR], medians["gather + ort"]
    lines = []
    for name in (
        "soagen onnxruntime",
        "soagen onnxruntime in place",
        "soagen onnxruntime compiled",
    ):
        ratio = medians[name] / floor
        within = (
            "n/a (n < 1000)" if n < TARGET_MIN_N else ("met" if ratio <= TARGET_RATIO else "missed")
        )
        faster = "met" if medians[name] <= gathered else "missed"
        lines.append(
            f"n = {n}, {name}: {ratio:.2f}x {FLOOR} (<= {TARGET_RATIO}x: {within}); "
            f"{medians[name] / gathered:.2f}x gather + ort (<= 1x: {faster})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--min-sample-ms", type=float, default=200.0)
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args(argv)
    set_cpu_threads(1)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        module = generated_module(SCHEMA, workdir, "bench_onnx_generated")
        exported, compiled = export_tagger(workdir)
        results: dict[int, dict[str, list[float]]] = {}
        lines = []
        for n in args.sizes:
            paths, readers = paths_for(module, exported, compiled, n)
            check(paths, readers, n)
            results[n] = measure(paths, args.repeats, args.min_sample_ms / 1e3)
    names = list(results[args.sizes[0]])
    header = "| path | " + " | ".join(f"n = {n}" for n in args.sizes) + " |"
    print(
        f"\n### DeepSetsTagger on cpu: median ms per call (ratio to `{FLOOR}`), {args.repeats} rounds\n"
    )
    print(header)
    print("|---|" + "---:|" * len(args.sizes))
    for name in names:
        cells = []
        for n in args.sizes:
            median = statistics.median(results[n][name])
            floor = statistics.median(results[n][FLOOR])
            cells.append(f"{median * 1e3:.3f} ({median / floor:.2f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    for n in args.sizes:
        medians = {name: statistics.median(taken) for name, taken in results[n].items()}
        lines += verdict(medians, n)
    print("\n".join(f"- {line}" for line in lines))
    if args.json:
        args.json.write_text(json.dumps({str(n): r for n, r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
