"""The model benchmark's smoke run: every path runs and matches the reference (no timing is judged)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO

pytest.importorskip("onnxruntime")
pytest.importorskip("matplotlib")


def test_quick_benchmark_checks_every_path_and_writes_results(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_models.py", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    for model in ("mlp", "gnn"):
        paths = set(report["results"][model]["1000"])
        assert {"ideal", "naive torch.stack", "soagen eager", "ort copies", "bind soagen"} <= paths
        assert (tmp_path / f"{model}.png").stat().st_size > 0
    assert "ort io-binding" in report["results"]["mlp"]["1000"]
    assert "soagen eager contiguous" in report["results"]["gnn"]["1000"]
    assert "| soagen torchscript |" in result.stdout
