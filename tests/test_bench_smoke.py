"""The model benchmark's smoke run: every path runs and matches the reference (no timing is judged)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("matplotlib")


def test_quick_benchmark_checks_every_path_and_writes_results(tmp_path: Path) -> None:
    # A subprocess: the benchmark sets process-wide thread counts and malloc options.
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_models.py",
            "--quick",
            "--no-cuda",
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
        "soagen eager",
        "soagen torchscript",
        "soagen compile",
        "soagen aot",
        "soagen aot columnwise",
        "soagen aot columnwise write",
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
        assert "soagen call, null model" in report["overhead"]["cpu"][model]["1000"]
        assert "soagen eager" in report["small_calls"][model]
        assert isinstance(report["memory"][model], dict), report["memory"][model]
    assert "soagen torchscript contiguous edge" in cpu["gnn"]["1000"]
    assert (tmp_path / "overhead.png").stat().st_size > 0
    assert set(report["generation"]) == {"mlp.soa", "gnn.soa"}
    for entry in report["generation"].values():
        assert entry["lint_ms"] > 0 and entry["lint_command_ms"] > 0
        assert entry["torch_imported"] is False  # read from the importing interpreter
    assert "| soagen torchscript |" in result.stdout
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
