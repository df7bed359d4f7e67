"""Small helpers shared by the tests: running the CLI in-process and generating into a temp package."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from soagen.cli import main
from soagen.dsl.loader import load
from soagen.generator.python import generate

REPO = Path(__file__).resolve().parent.parent


def assert_golden(text: str, golden: Path, update: bool) -> None:
    """`text` equals the checked-in `golden` file; with `update` (pytest --update-golden) the file is
    rewritten instead and the test skipped, since nothing was compared."""
    import pytest

    if update:
        changed = not golden.exists() or golden.read_text() != text
        golden.write_text(text)
        pytest.skip(f"{golden} {'rewritten: review the diff' if changed else 'unchanged'}")
    assert golden.exists(), f"{golden} is missing: run pytest --update-golden"
    assert text == golden.read_text(), f"{golden} differs: run pytest --update-golden and review"


def run_cli(*args: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(list(args))
    return status, stdout.getvalue(), stderr.getvalue()


def generate_package(schema_path: Path, root: Path, package: str) -> dict[str, Path]:
    """Generate a schema (and its imports) into `root/package/` and return module paths by name."""
    target = root / package
    target.mkdir(parents=True, exist_ok=True)
    (target / "__init__.py").write_text("")
    written = {}
    for name, text in generate(load(schema_path).unwrap()).items():
        path = target / f"{name}.py"
        path.write_text(text)
        written[name] = path
    return written


def import_generated(root: Path, package: str, module: str) -> ModuleType:
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return importlib.import_module(f"{package}.{module}")


def modules_imported_by(code: str, modules: tuple[str, ...] = ("torch", "numpy")) -> list[str]:
    """Which of `modules` a fresh interpreter has imported after running `code` (in the repo)."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    return [name for name in result.stdout.strip().split(",") if name]


# `soagen serve` of the example GNN, as the serving tests and benchmarks/bench_serving.py run it.
# A schema and model of every block shape: a [c, n] block, an [n, 3, 3] column, a block of scalars
# (one value per collection), and outputs into a layout of their own (`tracks` in conftest).
TRACK_SCHEMA = """
layout Tracks {
    align 64
    column float32 px, py, pz
    column float32[3, 3] cov
    scalar float32 bfield
}

layout TrackOut {
    column float32 a, b
    column float32 q
}

model TrackNet {
    input  momentum = Tracks{px, py, pz} as [c, n]
    input  cov      = Tracks{cov}        as [n, 3, 3]
    input  bfield   = Tracks{bfield}     as [n]
    output features = TrackOut{a, b}     as [c, n]
    output charge   = TrackOut{q}
}
"""

TRACK_FACTORY = """
import torch
from torch import nn


class TrackNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(3 + 9 + 1, 3)

    def forward(self, momentum, cov, bfield):
        n = bfield.shape[0]
        x = torch.cat([momentum.t(), cov.reshape(n, 9), bfield[:, None]], dim=1)
        h = self.mix(x)
        # A dict, keys not in schema order: the package returns them in schema order.
        return {"charge": torch.tanh(h[:, 2]), "features": h[:, :2].t() * 2}


def build():
    torch.manual_seed(1)
    return TrackNet().eval()


def not_a_module():
    return 42


def scripted():
    return torch.jit.script(build())
"""

SERVE_GNN = (
    "serve",
    "schemas/gnn.soa",
    "--model",
    "EdgeClassifier",
    "--factory",
    "examples/gnn_model.py:build_model",
)


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports of 127.0.0.1 (held together while chosen)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def serve_gnn_command(
    token_file: Path,
    *extra: str,
    model_file: Path | None = None,
    model: tuple[str, ...] | None = None,
) -> list[str]:
    """`soagen serve` of the example GNN (built by its factory, or loaded from `model_file`), or of
    `model` (`serve` and its model arguments), on free loopback ports, its access token written to
    `token_file`, its ready line in JSON (`serve_ready`)."""
    grpc_port, http_port = free_ports(2)
    if model is None:
        model = (
            SERVE_GNN if model_file is None else (*SERVE_GNN[:4], "--model-file", str(model_file))
        )
    return [
        sys.executable,
        "-m",
        "soagen",
        *model,
        "--grpc-port",
        str(grpc_port),
        "--http-port",
        str(http_port),
        "--token-file",
        str(token_file),
        "--format",
        "json",
        *extra,
    ]


def serve_ready(process: subprocess.Popen[str]) -> dict[str, object] | None:
    """The JSON line `soagen serve --format json` prints once it serves; None if it ended first."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{"):
            ready: dict[str, object] = json.loads(line)
            return ready
    return None


def assert_no_host_device_copies(call: Callable[[], object], stream: Any) -> None:
    """Profile `call`, which queues its work on the CUDA `stream`, and check that the GPU ran it
    with no host<->device copy. The profiler must have seen device events at all: without CUPTI it
    records none, copies included."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        call()
    stream.synchronize()
    events = profile.events()
    assert [event for event in events if event.device_type == torch.autograd.DeviceType.CUDA]
    assert not [e.name for e in events if "Memcpy HtoD" in e.name or "Memcpy DtoH" in e.name]


# Each integer dtype, and index values at the edges of every range an index range check treats
# apart: the dtype's extremes, the half range (where unsigned values turn negative seen as
# signed), and the bounds' neighbours.
INDEX_DTYPE_NAMES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
INDEX_EDGE_VALUES = (0, 1, 2, 126, 127, 128, 129, 255, 256, 32_767, 32_768, 65_535, 65_536)
INDEX_EDGE_VALUES += (2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1)
INDEX_EDGE_BOUNDS = (0, 1, 2, 127, 128, 129, 255, 256, 257, 32_767, 32_768, 32_769, 65_535)
INDEX_EDGE_BOUNDS += (65_536, 65_537, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 1)
INDEX_EDGE_BOUNDS += (2**62, 2**63)


def index_edge_values(dtype: Any) -> tuple[list[int], Any]:
    """Every edge value a torch integer dtype holds (its extremes, -1, `INDEX_EDGE_VALUES`), and
    them as a tensor of that dtype (uint64 past 2**63 written as the int64 of the same bits)."""
    import torch

    info = torch.iinfo(dtype)
    values = sorted({info.min, info.min + 1, -1, info.max - 1, info.max, *INDEX_EDGE_VALUES})
    values = [v for v in values if info.min <= v <= info.max]
    bits = torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.int64)
    return values, bits.view(dtype) if dtype.itemsize == 8 else bits.to(dtype)
