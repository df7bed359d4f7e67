"""The model benchmark's smoke run: every path runs and matches the reference (no timing is judged);
and its output check, which must reject a wrong path before any timing."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.helpers import REPO


def bench_models() -> ModuleType:
    sys.path.insert(0, str(REPO))
    return importlib.import_module("benchmarks.bench_models")


def test_output_check_rejects_a_wrong_result_and_a_path_that_writes_nothing() -> None:
    bench = bench_models()
    reference = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    out = torch.zeros(4, 2)
    case = bench.Case("mlp", 4, "cpu", reference)

    def right() -> None:
        out.copy_(reference)

    def silent() -> None:  # writes nothing: `out` holds the right values from an earlier call
        pass

    def wrong() -> torch.Tensor:
        return reference + 1

    case.paths = {"right": right, "silent": silent, "wrong": wrong}
    for name in ("right", "silent"):
        case.readers[name], case.written[name] = (lambda: out), [out]
    verify = bench.verifier(case)

    def timed(*names: str) -> dict[str, dict[str, object]]:
        paths = {name: case.paths[name] for name in names}
        stats: dict[str, dict[str, object]] = bench.time_paths(paths, 1, 0.0, lambda: None, verify)
        return stats

    assert timed("right")["right"]["check"] == "passed"
    # `out` now holds the reference; the check zeroes it first, so writing nothing fails.
    with pytest.raises(SystemExit, match="path 'silent' is wrong"):
        timed("right", "silent")
    with pytest.raises(SystemExit, match="path 'wrong' is wrong"):
        timed("wrong")
    # A backend runner's one-element list is unwrapped; an empty one is read back, then judged.
    bench.check(case, "right", lambda: [reference.clone()])
    with pytest.raises(SystemExit, match="path 'silent' is wrong"):
        bench.check(case, "silent", lambda: [])
    with pytest.raises(SystemExit, match="returned no output"):
        bench.check(case, "wrong", lambda: None)


def test_side_by_side_ratios_compare_each_rounds_two_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`time_side_by_side` divides the second path's sample by the first's within each round, and
    judges the eager targets on their median; read off a clock that each call moves by a set
    amount, one that slows down halfway as a busy host does."""
    bench = bench_models()
    clock = [0.0]
    slowdown = [1.0]

    def first() -> None:
        clock[0] += 1e-3 * slowdown[0]

    def second() -> None:
        clock[0] += 1.25e-3 * slowdown[0]
        if clock[0] > 0.5:
            slowdown[0] = 3.0  # both paths, from here on

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    found = bench.time_side_by_side(first, second, lambda: None, budget_s=1.0, sample_s=4e-3)
    assert found["calls_per_sample"] == 2 and found["rounds"] == 222
    assert found["ratio"] == pytest.approx(1.25)
    assert found["q1"] <= found["ratio"] <= found["q3"] < 1.3
    judged = bench.eager_judgement(found, 1.4, 1.15)
    assert judged.startswith("1.25x MISSED side by side") and "round-robin medians 1.40x" in judged
    assert bench.eager_judgement(None, 1.1, 1.15) == "1.10x ok (round-robin medians)"


def test_gpu_targets_are_judged_from_a_report() -> None:
    bench = bench_models()

    def stats(us: float) -> dict[str, float]:
        return {"median_ms": us / 1e3}

    report = {
        "overhead": {
            "cuda": {
                "mlp": {
                    "1000": {bench.NULL_CALL: stats(15.0), bench.NULL_GRAPHS: stats(8.0)},
                    "100000": {bench.NULL_CALL: stats(16.0), bench.NULL_GRAPHS: stats(9.5)},
                },
                "gnn": {"1000": {bench.NULL_CALL: stats(9.0), bench.NULL_GRAPHS: stats(12.0)}},
            }
        },
        "results": {
            "cuda": {
                "mlp": {
                    "1000": {
                        "naive torch.stack": stats(90.0),
                        "naive np.stack": stats(120.0),
                        "soagen eager": stats(75.0),
                        "soagen eager graphs": stats(20.0),
                    },
                    "100000": {"naive torch.stack": stats(90.0), "soagen eager": stats(95.0)},
                }
            }
        },
    }
    assert bench.cuda_target_lines(report) == [
        "- mlp on cuda, null call <= 10 us (the first verdict is the target's): "
        "CUDA graphs 8.0-9.5 us ok; plain 15.0-16.0 us MISSED",
        "- gnn on cuda, null call <= 10 us (the first verdict is the target's): "
        "CUDA graphs 12.0-12.0 us MISSED; plain 9.0-9.0 us ok",
        "- mlp on cuda, fastest soagen vs fastest naive gather, end to end: "
        "1e3: eager graphs 0.22x torch.stack ok; 1e5: eager 1.06x torch.stack MISSED",
    ]


def test_the_large_eager_target_shows_the_contiguous_copy_beside_the_view() -> None:
    """Where the eager binding with contiguous copies ran, its ratio stands beside the judged
    one: the remedy for kernels that slow down on column-major views, not the judged path."""
    bench = bench_models()

    def stats(ms: float) -> dict[str, float]:
        return {"median_ms": ms}

    row = {
        "ideal": stats(10.0),
        "soagen eager": stats(11.6),
        "soagen eager contiguous edge": stats(10.1),
    }
    report = {"results": {"cpu": {"gnn": {"100000": row}}}}
    lines = bench.evaluate_targets(report)
    (line,) = [line for line in lines if "eager vs ideal at n >= 1e5" in line]
    assert line == (
        "- gnn, eager vs ideal at n >= 1e5 (target <= 1.05x): 1e5: 1.16x MISSED (round-robin "
        "medians); eager contiguous edge 1.01x (round-robin medians)"
    )


def test_quick_benchmark_checks_every_path_and_writes_results(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    pytest.importorskip("matplotlib")
    # A subprocess: the benchmark sets process-wide thread counts and malloc options.
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_models.py",
            "--quick",
            "--no-cuda",
            # One AOT package per model: the columnwise and write-outputs variants, two more
            # compiles each, are built and checked in tests/build and tests/runtime.
            "--backends",
            "eager,torchscript,compile,aot",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    cpu = report["results"]["cpu"]
    expected = {
        "ideal",
        "naive torch.stack",
        "naive np.stack",
        "naive torch.tensor",
        "soagen eager",
        "soagen torchscript",
        "soagen compile",
        "soagen aot",
        "ort copies",
        "ort io-binding",
        "ort io-binding bound once",
    }
    for model in ("mlp", "gnn"):
        for n, paths in cpu[model].items():
            assert expected <= set(paths), (model, n)
            # Each path's output was compared with the reference before it was timed.
            assert {entry["check"] for entry in paths.values()} == {"passed"}, (model, n)
        assert (tmp_path / f"{model}.png").stat().st_size > 0
        overhead = report["overhead"]["cpu"][model]["1000"]
        assert {"soagen call, null model", "naive torch.tensor gather"} <= set(overhead)
        assert "soagen eager" in report["small_calls"][model]
        assert "soagen eager, collections wrapped anew" in report["small_calls"][model]
        assert {e["check"] for e in report["small_calls"][model].values()} == {"passed"}
        memory = report["memory"][model]
        assert isinstance(memory, dict), memory
        assert {"ort copies", "ort io-binding"} <= set(memory)  # ORT probed in --quick too
        assert report["run_memory"]["cpu"][model]["1000"] > 0  # what the next size's fit scales
        tuning = report["malloc_tuning"]
        assert isinstance(tuning, dict), tuning
        assert set(tuning["results"][model]["1000"]) == {"ideal", "soagen eager", "soagen aot"}
        for entry in tuning["results"][model]["1000"].values():
            assert entry["check"] == "passed" and entry["on_ms"] > 0 and entry["off_ms"] > 0
    assert "soagen call, null model + index range check" in report["overhead"]["cpu"]["gnn"]["1000"]
    assert "soagen torchscript contiguous edge" in cpu["gnn"]["1000"]
    assert (tmp_path / "overhead.png").stat().st_size > 0
    assert set(report["generation"]) == {"mlp.soa", "gnn.soa"}
    for entry in report["generation"].values():
        assert entry["lint_ms"] > 0 and entry["lint_command_ms"] > 0
        assert entry["torch_imported"] is False  # read from the importing interpreter
    assert "| soagen torchscript |" in result.stdout
    assert "| mlp | 1e3 | soagen eager |" in result.stdout  # the malloc tuning table
    assert "ONNX Runtime without its arena" in result.stdout
    # Not judged in a smoke run, but the judging itself runs on its numbers.
    assert "not judged: a --quick run" in result.stdout
    judged = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; sys.path.insert(0, 'benchmarks'); import bench_models; "
            f"print('\\n'.join(bench_models.evaluate_targets(json.load(open({str(tmp_path / 'results.json')!r})))))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert judged.returncode == 0, judged.stderr[-3000:]
    for model in ("mlp", "gnn"):
        assert f"- {model}, fastest soagen vs ONNX Runtime: 1e3:" in judged.stdout
        assert f"- {model}, binding layer at n = " in judged.stdout
        assert re.search(
            rf"- {model}, eager vs ideal at n = 1e3 \(target <= 1.15x\): [\d.]+x (ok|MISSED) "
            rf"side by side \(quartiles [\d.]+-[\d.]+x, \d+ rounds\)",
            judged.stdout,
        )
        paired = report["side_by_side"]["cpu"][model]["1000"]
        assert paired["q1"] <= paired["ratio"] <= paired["q3"] and paired["rounds"] >= 20
        assert f"- {model}, eager vs ideal at n >= 1e5 (target <= 1.05x): not judged (" in (
            judged.stdout
        )
        # No n >= 1e5 in a smoke run: the line says so instead of staying empty.
        assert f"- {model}, fastest soagen vs ideal (n >= 1e5): not judged (" in judged.stdout
    assert "the target's n = 1e7 did not run" in judged.stdout
    assert re.search(
        r"- gnn, a new event's call at n = 2 .*: eager \+[\d.]+ us, aot \+", judged.stdout
    )
    assert 'index range check off (`index_bounds={"edge_index": None}`)' in judged.stdout
    assert "- gnn, binding layer with the index range check" in judged.stdout


def test_the_onnx_benchmark_checks_every_path_against_the_floor(tmp_path: Path) -> None:
    """The tagger benchmark's smoke run: every path runs and equals ONNX Runtime on pre-made
    tensors before it is timed (the script exits non-zero otherwise)."""
    pytest.importorskip("onnxruntime")
    samples = tmp_path / "samples.json"
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_onnx.py",
            *("--sizes", "1", "70", "--repeats", "1", "--min-sample-ms", "1"),
            *("--json", str(samples)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    taken = json.loads(samples.read_text())
    assert set(taken) == {"1", "70"}
    assert set(taken["70"]) == {
        "ort pre-made",
        "gather + ort",
        "soagen onnxruntime",
        "soagen onnxruntime in place",
        "soagen onnxruntime compiled",
        "soagen eager",
    }
    assert "soagen onnxruntime compiled" in result.stdout


def test_the_onnx_benchmark_refuses_a_path_that_disagrees() -> None:
    sys.path.insert(0, str(REPO))
    bench = importlib.import_module("benchmarks.bench_onnx")
    floor, block = torch.arange(10.0).reshape(2, 5), torch.zeros(2, 5)
    readers = {bench.FLOOR: lambda: floor, "right": lambda: block, "wrong": lambda: block}
    paths = {
        bench.FLOOR: lambda: None,
        "right": lambda: block.copy_(floor),
        "wrong": lambda: block.copy_(floor).add_(1e-3),
    }
    with pytest.raises(SystemExit, match="n = 2: wrong disagrees with ort pre-made"):
        bench.check(paths, readers, 2)
    del paths["wrong"]
    bench.check(paths, readers, 2)


def test_the_serving_benchmark_refuses_a_binding_that_disagrees() -> None:
    """`bench_serving.py --servers` checks each binding against local execution before timing it
    (no server here: a local binding of another model stands in for a wrong one)."""
    sys.path.insert(0, str(REPO))
    bench = importlib.import_module("benchmarks.bench_serving")
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier, EdgeScores

    local = EdgeClassifier(build_model())
    events = [bench.event(n, n) for n in (1, 50, 300)]
    expected = []
    for nodes, edges in events:
        out = EdgeScores.allocate(edges.size)
        local(nodes, edges, out=out)
        expected.append(out.score.clone())
    bench.check_results(local, events, expected, "local")
    other = build_model()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(1e-3)
    with pytest.raises(SystemExit, match=r"2 server\(s\): event 0 \(1 edges\) differs"):
        bench.check_results(EdgeClassifier(other), events, expected, "2 server(s)")
    assert bench.stream(local, events, 2) > 0


def test_instruction_counts_are_read_per_path_and_judged_against_each_runner(
    tmp_path: Path,
) -> None:
    """`count_instructions.py` reads callgrind's dumps by the label each was dumped at (in dump
    order, 10 after 9), takes the empty call's count off every path, sets each soagen path at
    n = 2 against its own backend's bare runner, and each path at a larger n against the ideal
    path at that n. (Running valgrind takes minutes: not here.)"""
    sys.path.insert(0, str(REPO))
    count = importlib.import_module("benchmarks.count_instructions")
    dumps = {
        1: (count.EMPTY_CALL, 1_000, 10),
        2: ("gnn/soagen aot write", 340_000, 10),
        9: ("gnn n=1000/ideal", 4_002_000, 20),
        10: ("gnn/aot write runner alone", 320_000, 10),
        11: ("gnn/ideal (eager, contiguous)", 900_000, 10),
        12: ("gnn n=1000/soagen eager", 4_602_000, 20),
        13: ("gnn/eager runner alone", 6_000_000, 10),
        14: ("gnn/soagen eager, collections wrapped anew", 9_500_000, 10),
    }
    for number, (label, total, _) in dumps.items():
        (tmp_path / f"callgrind.out.{number}").write_text(
            f"version: 1\ncreator: callgrind-3.19.0\ndesc: Trigger: Client Request: {label}\n"
            f"events: Ir\nsummary: {total}\n"
        )
    (tmp_path / "callgrind.out").write_text("desc: Trigger: Program termination\ntotals: 5\n")
    counts = count.counted(tmp_path)
    assert list(counts) == [label for label, _, _ in dumps.values()]
    rows = count.table(counts, {label: calls for label, _, calls in dumps.values()})
    assert "| gnn | soagen aot write | 33,900 | +2,000 |" in rows
    assert "| gnn | aot write runner alone | 31,900 |  |" in rows
    assert "| gnn | ideal (eager, contiguous) | 89,900 |  |" in rows
    assert "| gnn | 1e+03 | ideal | 200,000 | 1.000x |" in rows
    assert "| gnn | 1e+03 | soagen eager | 230,000 | 1.150x |" in rows
    # A new event's call, against the runner of the backend it runs.
    assert "| gnn | soagen eager, collections wrapped anew | 949,900 | +350,000 |" in rows
