"""Fixtures shared by the tests: the torch devices present, and modules generated from schema text."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis profiles: "ci" (the default) keeps property tests to a bounded number of examples;
# `HYPOTHESIS_PROFILE=long` runs many more locally. Tests that set max_examples themselves keep it.
settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _available_devices() -> list[object]:
    """CPU always; CUDA and MPS as parameters that skip cleanly where the machine lacks them."""
    try:
        import torch
    except ImportError:  # the generator tests run without torch
        return ["cpu"]
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    return [
        "cpu",
        pytest.param("cuda:0", marks=pytest.mark.skipif(not cuda, reason="no CUDA device")),
        pytest.param("mps", marks=pytest.mark.skipif(not mps, reason="no MPS device")),
    ]


@pytest.fixture(params=_available_devices())
def device(request: pytest.FixtureRequest) -> str:
    """Each torch device of the machine in turn."""
    return str(request.param)


@pytest.fixture(scope="session")
def generated_from_text(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[str], ModuleType]]:
    """Generate a one-file schema given as text and import the module (cached by text)."""
    from soagen.dsl.loader import load
    from soagen.generator.python import generate

    root = tmp_path_factory.mktemp("generated_from_text")
    sys.path.insert(0, str(root))
    modules: dict[str, ModuleType] = {}

    def make(text: str) -> ModuleType:
        if text in modules:
            return modules[text]
        package = "soa_" + hashlib.sha256(text.encode()).hexdigest()[:16]
        target = root / package
        target.mkdir()
        (target / "__init__.py").write_text("")
        schema = Path(target / "schema.soa")
        schema.write_text(text)
        for name, code in generate(load(schema).unwrap()).items():
            (target / f"{name}.py").write_text(code)
        importlib.invalidate_caches()
        modules[text] = importlib.import_module(f"{package}.schema")
        return modules[text]

    yield make
    sys.path.remove(str(root))


def compile_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    """`soagen compile ARGS` in a fresh interpreter, from the repository root."""
    from tests.helpers import REPO

    return subprocess.run(
        [sys.executable, "-m", "soagen", "compile", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="session")
def gnn_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The example GNN compiled for CPU by `soagen compile` in a subprocess, once per session
    (the compile and serving tests share it): (package, stdout, stderr)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("aot") / "edge_classifier.pt2"
    done = compile_subprocess(
        "schemas/gnn.soa",
        "--model",
        "EdgeClassifier",
        "--factory",
        "examples/gnn_model.py:build_model",
        "--device",
        "cpu",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return out, done.stdout, done.stderr


@pytest.fixture(scope="session")
def tracks(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Path, Path]:
    """The track schema's module, its factory file and its package built by `compile_model`
    (`--columnwise --write-outputs`), once per session."""
    pytest.importorskip("torch")
    from soagen.build.compile import compile_model
    from tests.helpers import TRACK_FACTORY, TRACK_SCHEMA, generate_package, import_generated

    root = tmp_path_factory.mktemp("tracks")
    (root / "tracks.soa").write_text(TRACK_SCHEMA)
    (root / "track_model.py").write_text(TRACK_FACTORY)
    lines: list[str] = []
    package = compile_model(
        root / "tracks.soa",
        "TrackNet",
        f"{root / 'track_model.py'}:build",
        output=root / "out" / "tracks.pt2",
        columnwise=True,
        write_outputs=True,
        progress=lines.append,
    )
    assert package == root / "out" / "tracks.pt2" and package.is_file()
    assert len([line for line in lines if "done in" in line]) == 6
    assert "columnwise: mix (1 of 1 nn.Linear layers)" in lines
    assert [p.name for p in package.parent.iterdir()] == ["tracks.pt2"]  # no staging file left
    generate_package(root / "tracks.soa", root, "pkg_compile_tracks")
    return import_generated(root, "pkg_compile_tracks", "tracks"), root / "track_model.py", package
