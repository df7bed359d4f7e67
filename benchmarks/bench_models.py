"""soagen against what users do today: one model, one set of collections, every path in one process.

Paths, each checked against the reference output before it is timed:
- `soagen <backend>`: bind zero-copy views, run, write the outputs back (eager, torchscript, compile,
  aot; `soagen eager contiguous` hands the gathered GNN input over as a contiguous copy);
- `ideal`: the model alone on pre-made contiguous tensors (no gather, no write-back);
- `naive torch.stack`, `naive np.stack`: gather the columns into new tensors, run, copy the result
  back into the output columns (what a conversion layer does);
- `ort copies`: the model exported to ONNX, run by ONNX Runtime with the copies its `run` API needs;
- `ort io-binding` (MLP): ONNX Runtime reading the SoA block in place as a dense [c, pitch] array and
  writing straight into the output columns (the model takes [c, n]; it also computes the padding).
Plus the binding layer alone (`overhead` rows: a null model returning a precomputed result, so the
time is building views, checks and the write-back) against the naive gather with the same null model.

Repeats are interleaved (every path once per round), so machine noise hits all paths alike; the
table shows medians, the JSON keeps min/median/max. One intra-op thread and soagen's malloc tuning
apply to every path, as they would in a reconstruction job.

    python benchmarks/bench_models.py            # n = 1e3 .. 1e7 (GNN to 1e6), results in benchmarks/results
    python benchmarks/bench_models.py --quick    # smoke run: small n, two repeats, no compiling
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.models import ColumnsFirst, build_mlp  # noqa: E402
from examples.gnn_model import build_model as build_gnn  # noqa: E402
from soagen.dsl.loader import load  # noqa: E402
from soagen.generator.python import generate  # noqa: E402
from soagen.runtime import set_cpu_threads, set_malloc_tuning  # noqa: E402

Path_ = Callable[[], torch.Tensor]  # runs one path, returns its output for the check


@dataclass
class Case:
    """One model at one size: its paths and the reference output."""

    model: str
    n: int
    reference: torch.Tensor
    paths: dict[str, Path_] = field(default_factory=dict)
    # Paths whose output is not the model's: what each must equal instead.
    checked_against: dict[str, torch.Tensor] = field(default_factory=dict)


def generated_module(schema: Path, workdir: Path, package: str) -> ModuleType:
    """Generate a schema into `workdir/package` and import it."""
    target = workdir / package
    target.mkdir(parents=True, exist_ok=True)
    (target / "__init__.py").write_text("")
    for name, text in generate(load(schema).unwrap()).items():
        (target / f"{name}.py").write_text(text)
    sys.path.insert(0, str(workdir))
    return importlib.import_module(f"{package}.{schema.stem}")


def aot_package(schema: Path, model: str, factory: str, cache: Path) -> Path:
    """A `soagen compile` package, built once per schema, factory and torch version."""
    from soagen.compile import compile_model

    key = hashlib.sha256(
        (schema.read_text() + factory + torch.__version__ + platform.machine()).encode()
    ).hexdigest()[:12]
    path = cache / f"{model}-{key}.pt2"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"compiling {model} ahead of time (once) ...", file=sys.stderr, flush=True)
        compile_model(schema, model, factory, output=path)
    return path


def onnx_session(
    net: torch.nn.Module, example: tuple[torch.Tensor, ...], dynamic: object
) -> object:
    """An ONNX Runtime session (one thread: more gave wrong GNN results, see RESULTS.md)."""
    import onnxruntime

    program = torch.onnx.export(net, example, dynamo=True, dynamic_shapes=dynamic, verbose=False)
    assert program is not None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        program.save(str(path))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class NullModel(torch.nn.Module):
    """Returns a precomputed result: what is left to time is the binding layer itself."""

    def __init__(self, result: torch.Tensor) -> None:
        super().__init__()
        self.result = result

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.result


# --- the MLP ------------------------------------------------------------------------------------


def mlp_case(n: int, module: ModuleType, backends: list[str], tools: dict[str, object]) -> Case:
    hits, scores = module.Hits.allocate(n), module.HitScores.allocate(n)
    generator = torch.Generator().manual_seed(n)
    for column in ("x", "y", "z", "energy"):
        hits.member(column).copy_(torch.randn(n, generator=generator))
    net = tools["mlp"]
    assert isinstance(net, torch.nn.Module)
    contiguous = hits.block("features").contiguous()
    with torch.inference_mode():
        reference = net(contiguous)
    case = Case("mlp", n, reference)
    columns = [hits.x, hits.y, hits.z, hits.energy]
    arrays = [column.numpy() for column in columns]
    out_columns = [scores.signal, scores.noise]
    out_arrays = [column.numpy() for column in out_columns]

    def written() -> torch.Tensor:
        return torch.stack(out_columns, dim=1)

    def ideal() -> torch.Tensor:
        with torch.inference_mode():
            result: torch.Tensor = net(contiguous)
        return result

    def write_back(result: torch.Tensor) -> torch.Tensor:
        for index, column in enumerate(out_columns):
            column.copy_(result[:, index])
        return written()

    def naive_torch() -> torch.Tensor:
        with torch.inference_mode():
            return write_back(net(torch.stack(columns, dim=1)))

    def naive_numpy() -> torch.Tensor:
        with torch.inference_mode():
            return write_back(net(torch.from_numpy(np.stack(arrays, axis=1))))

    case.paths |= {"ideal": ideal, "naive torch.stack": naive_torch, "naive np.stack": naive_numpy}
    for backend in backends:
        model = soagen_model(module.HitMlp, net, backend, tools.get("mlp.pt2"))

        def call(model: object = model) -> torch.Tensor:
            model(hits, out=scores)  # type: ignore[operator]
            return written()

        case.paths[f"soagen {backend}"] = call
    session = tools.get("mlp.onnx")
    if session is not None:

        def ort_copies() -> torch.Tensor:
            (result,) = session.run(None, {"features": np.stack(arrays, axis=1)})  # type: ignore[attr-defined]
            for index, array in enumerate(out_arrays):
                array[:] = result[:, index]
            return written()

        case.paths["ort copies"] = ort_copies
    session_t = tools.get("mlp_t.onnx")
    if session_t is not None:
        binding = session_t.io_binding()  # type: ignore[attr-defined]
        view_in, view_out = hits.block("features"), scores.block("scores")
        # [n, c] views with strides (1, P): the same bytes are a dense [c, P] array.
        pitch_in, pitch_out = view_in.stride(1), view_out.stride(1)
        (input_name,) = [entry.name for entry in session_t.get_inputs()]  # type: ignore[attr-defined]
        (output_name,) = [entry.name for entry in session_t.get_outputs()]  # type: ignore[attr-defined]
        binding.bind_input(input_name, "cpu", 0, np.float32, (4, pitch_in), view_in.data_ptr())
        binding.bind_output(output_name, "cpu", 0, np.float32, (2, pitch_out), view_out.data_ptr())

        def ort_io_binding() -> torch.Tensor:
            session_t.run_with_iobinding(binding)  # type: ignore[attr-defined]
            return written()

        case.paths["ort io-binding"] = ort_io_binding
    null_result = reference.clone()
    null = module.HitMlp(NullModel(null_result))

    def overhead_soagen() -> torch.Tensor:
        null(hits, out=scores)
        return written()

    def overhead_naive() -> torch.Tensor:
        torch.stack(columns, dim=1)
        return write_back(null_result)

    def bind_soagen() -> torch.Tensor:
        return hits.block("features")

    def bind_naive() -> torch.Tensor:
        return torch.stack(columns, dim=1)

    case.paths |= {
        "overhead soagen": overhead_soagen,
        "overhead naive": overhead_naive,
        "bind soagen": bind_soagen,
        "bind naive": bind_naive,
    }
    case.checked_against = {"bind soagen": contiguous, "bind naive": contiguous}
    return case


# --- the GNN ------------------------------------------------------------------------------------


def gnn_case(n: int, module: ModuleType, backends: list[str], tools: dict[str, object]) -> Case:
    n_nodes = max(2, n // 10)
    nodes, edges = module.Nodes.allocate(n_nodes), module.Edges.allocate(n)
    scores = module.EdgeScores.allocate(n)
    generator = torch.Generator().manual_seed(n)
    for column in ("x", "y", "z", "energy"):
        nodes.member(column).copy_(torch.randn(n_nodes, generator=generator))
    edges.src.copy_(torch.randint(0, n_nodes, (n,), generator=generator))
    edges.dst.copy_(torch.randint(0, n_nodes, (n,), generator=generator))
    edges.delta_r.copy_(torch.rand(n, generator=generator))
    edges.delta_eta.copy_(torch.randn(n, generator=generator))
    net = tools["gnn"]
    assert isinstance(net, torch.nn.Module)
    node_columns = [nodes.x, nodes.y, nodes.z, nodes.energy]
    index_columns = [edges.src, edges.dst]
    edge_columns = [edges.delta_r, edges.delta_eta]
    premade = (
        torch.stack(node_columns, dim=1),
        torch.stack(index_columns),
        torch.stack(edge_columns, dim=1),
    )
    with torch.inference_mode():
        reference = net(*premade)
    case = Case("gnn", n, reference)

    def ideal() -> torch.Tensor:
        with torch.inference_mode():
            result: torch.Tensor = net(*premade)
        return result

    def naive_torch() -> torch.Tensor:
        with torch.inference_mode():
            result = net(
                torch.stack(node_columns, dim=1),
                torch.stack(index_columns),
                torch.stack(edge_columns, dim=1),
            )
            scores.score.copy_(result)
        return scores.score

    def naive_numpy() -> torch.Tensor:
        with torch.inference_mode():
            result = net(
                torch.from_numpy(np.stack([c.numpy() for c in node_columns], axis=1)),
                torch.from_numpy(np.stack([c.numpy() for c in index_columns])),
                torch.from_numpy(np.stack([c.numpy() for c in edge_columns], axis=1)),
            )
            scores.score.copy_(result)
        return scores.score

    case.paths |= {"ideal": ideal, "naive torch.stack": naive_torch, "naive np.stack": naive_numpy}
    variants = [(backend, ()) for backend in backends]
    if "eager" in backends:
        variants.append(("eager", ("node_features",)))
    for backend, contiguous in variants:
        model = soagen_model(module.EdgeClassifier, net, backend, tools.get("gnn.pt2"), contiguous)

        def call(model: object = model) -> torch.Tensor:
            model(nodes, edges, out=scores)  # type: ignore[operator]
            return scores.score

        case.paths[f"soagen {backend}" + (" contiguous" if contiguous else "")] = call
    session = tools.get("gnn.onnx")
    if session is not None:

        def ort_copies() -> torch.Tensor:
            (result,) = session.run(  # type: ignore[attr-defined]
                None,
                {
                    "node_features": np.stack([c.numpy() for c in node_columns], axis=1),
                    "edge_index": np.stack([c.numpy() for c in index_columns]),
                    "edge_features": np.stack([c.numpy() for c in edge_columns], axis=1),
                },
            )
            scores.score.numpy()[:] = result
            return scores.score

        case.paths["ort copies"] = ort_copies
    null_result = reference.clone()
    null = module.EdgeClassifier(NullModel(null_result))

    def overhead_soagen() -> torch.Tensor:
        null(nodes, edges, out=scores)
        return scores.score

    def overhead_naive() -> torch.Tensor:
        torch.stack(node_columns, dim=1), torch.stack(index_columns)
        torch.stack(edge_columns, dim=1)
        scores.score.copy_(null_result)
        return scores.score

    blocks = [
        (nodes, "node_features"),
        (edges, "edge_index"),
        (edges, "edge_features"),
    ]

    def bind_soagen() -> torch.Tensor:
        views = [collection.block(name) for collection, name in blocks]
        return views[0]

    def bind_naive() -> torch.Tensor:
        premade = [
            torch.stack(node_columns, dim=1),
            torch.stack(index_columns),
            torch.stack(edge_columns, dim=1),
        ]
        return premade[0]

    case.paths |= {
        "overhead soagen": overhead_soagen,
        "overhead naive": overhead_naive,
        "bind soagen": bind_soagen,
        "bind naive": bind_naive,
    }
    case.checked_against = {"bind soagen": premade[0], "bind naive": premade[0]}
    return case


def soagen_model(
    binding: type,
    net: torch.nn.Module,
    backend: str,
    package: object,
    contiguous: tuple[str, ...] = (),
) -> object:
    if backend == "aot":
        return binding.load(package, contiguous=contiguous)
    if backend == "torchscript":
        return binding(torch.jit.script(net), contiguous=contiguous)
    return binding(net, backend=backend, contiguous=contiguous)


# --- measuring ----------------------------------------------------------------------------------


def check_and_time(case: Case, repeats: int) -> dict[str, dict[str, float]]:
    """Check every path's output, warm it up, then time all paths round-robin."""
    for name, path in case.paths.items():
        path()  # warm-up: placement, compilation, first-touch of memory
        output = path()
        try:
            expected = case.checked_against.get(name, case.reference)
            torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5)
        except AssertionError as error:
            raise SystemExit(f"{case.model} n={case.n}: path {name!r} is wrong: {error}") from None
    samples: dict[str, list[float]] = {name: [] for name in case.paths}
    for _ in range(repeats):
        for name, path in case.paths.items():
            start = time.perf_counter()
            path()
            samples[name].append(time.perf_counter() - start)
    return {
        name: {
            "median_ms": statistics.median(taken) * 1e3,
            "min_ms": min(taken) * 1e3,
            "max_ms": max(taken) * 1e3,
        }
        for name, taken in samples.items()
    }


def markdown(results: dict[str, dict[int, dict[str, dict[str, float]]]]) -> str:
    lines = []
    for model, by_n in results.items():
        sizes = sorted(by_n)
        paths = list(by_n[sizes[0]])
        lines.append(f"\n### {model} (median ms per call; ratio to `ideal` in brackets)\n")
        lines.append("| path | " + " | ".join(f"n = {n:.0e}" for n in sizes) + " |")
        lines.append("|---|" + "---:|" * len(sizes))
        for path in paths:
            cells = []
            for n in sizes:
                median = by_n[n][path]["median_ms"]
                ideal = by_n[n]["ideal"]["median_ms"]
                cells.append(f"{median:.3g} ({median / ideal:.2f}x)")
            lines.append(f"| {path} | " + " | ".join(cells) + " |")
        for label, naive, ours in (
            ("input binding: naive gather / soagen views", "bind naive", "bind soagen"),
            (
                "null-model call incl. write-back: naive / soagen",
                "overhead naive",
                "overhead soagen",
            ),
        ):
            ratios = [by_n[n][naive]["median_ms"] / by_n[n][ours]["median_ms"] for n in sizes]
            lines.append(
                f"\n{label}: "
                + ", ".join(
                    f"{ratio:.3g}x at n = {n:.0e}" for n, ratio in zip(sizes, ratios, strict=True)
                )
            )
    return "\n".join(lines)


def plot(results: dict[str, dict[int, dict[str, dict[str, float]]]], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for model, by_n in results.items():
        sizes = sorted(by_n)
        figure, axes = plt.subplots(figsize=(8, 5))
        for path in by_n[sizes[0]]:
            if path.startswith(("overhead", "bind")):
                continue
            axes.plot(sizes, [by_n[n][path]["median_ms"] for n in sizes], marker="o", label=path)
        axes.set(xscale="log", yscale="log", xlabel="n", ylabel="ms per call", title=model)
        axes.legend(fontsize=7)
        axes.grid(True, which="both", alpha=0.3)
        path = folder / f"{model}.png"
        figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: small n, 2 repeats")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-n", type=float, default=1e7, help="largest n (MLP)")
    parser.add_argument("--gnn-max-n", type=float, default=1e6, help="largest n (GNN edges)")
    parser.add_argument("--no-onnx", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument("--no-malloc-tuning", action="store_true")
    args = parser.parse_args(argv)

    set_cpu_threads(1, 1)
    set_malloc_tuning(not args.no_malloc_tuning)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        sizes, repeats, backends = [1_000, 4_000], 2, ["eager", "torchscript"]
        gnn_max_n = 4_000.0
    else:
        sizes = [10**k for k in range(3, 8) if 10**k <= args.max_n]
        repeats, backends = args.repeats, ["eager", "torchscript", "compile", "aot"]
        gnn_max_n = args.gnn_max_n
    workdir = Path(tempfile.mkdtemp(prefix="soagen-bench-models-"))
    modules = {
        "mlp": generated_module(REPO / "benchmarks" / "schemas" / "mlp.soa", workdir, "bench_mlp"),
        "gnn": generated_module(REPO / "schemas" / "gnn.soa", workdir, "bench_gnn"),
    }
    tools: dict[str, object] = {"mlp": build_mlp(), "gnn": build_gnn()}
    if "aot" in backends:
        cache = args.out / "packages"
        tools["mlp.pt2"] = aot_package(
            REPO / "benchmarks" / "schemas" / "mlp.soa",
            "HitMlp",
            f"{REPO / 'benchmarks' / 'models.py'}:build_mlp",
            cache,
        )
        tools["gnn.pt2"] = aot_package(
            REPO / "schemas" / "gnn.soa",
            "EdgeClassifier",
            f"{REPO / 'examples' / 'gnn_model.py'}:build_model",
            cache,
        )
    if not args.no_onnx:
        rows = torch.export.Dim("rows", min=2)
        nodes, edges = torch.export.Dim("nodes", min=2), torch.export.Dim("edges", min=2)
        mlp, gnn = tools["mlp"], tools["gnn"]
        assert isinstance(mlp, torch.nn.Module) and isinstance(gnn, torch.nn.Module)
        tools["mlp.onnx"] = onnx_session(mlp, (torch.randn(64, 4),), ({0: rows},))
        tools["mlp_t.onnx"] = onnx_session(ColumnsFirst(mlp), (torch.randn(4, 64),), ({1: rows},))
        gnn_example = (torch.randn(16, 4), torch.randint(0, 16, (2, 64)), torch.rand(64, 2))
        tools["gnn.onnx"] = onnx_session(gnn, gnn_example, ({0: nodes}, {1: edges}, {0: edges}))

    results: dict[str, dict[int, dict[str, dict[str, float]]]] = {"mlp": {}, "gnn": {}}
    for n in sizes:
        for model, build in (("mlp", mlp_case), ("gnn", gnn_case)):
            if model == "gnn" and n > gnn_max_n:
                continue
            print(f"{model} n = {n:.0e} ...", file=sys.stderr, flush=True)
            case = build(n, modules[model], backends, tools)
            results[model][n] = check_and_time(case, repeats)
            del case
    machine = {
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "malloc_tuning": not args.no_malloc_tuning,
    }
    try:
        import onnxruntime

        machine["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    table = markdown(results)
    print(table)
    (args.out / "results.json").write_text(
        json.dumps({"machine": machine, "results": results}, indent=1)
    )
    (args.out / "results.md").write_text(table + "\n")
    for path in plot(results, args.out):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
