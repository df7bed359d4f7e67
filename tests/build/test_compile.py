"""`soagen compile` and AOTInductor packages: real packages, compiled once per session.

Two packages are built (AOTInductor takes 10-40 s each): the GNN example through the CLI in a
subprocess, exactly as a user runs it, and a small track model through `compile_model` with
`columnwise=True` (its one narrow layer computed column by column) and `write_outputs=True` (it
stores its results into the output blocks it is given), whose inputs cover a [c, n]
block, an array column ([n, 3, 3], strides (1, P, 3P)), a scalar broadcast over n (stride 0), and
whose two outputs come back as a dict. Everything else (refusals, argument
errors) needs no compiler.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from soagen.build.compile import CompileError, compile_model  # noqa: E402
from soagen.build.errors import CommandError  # noqa: E402
from soagen.runtime.aot import METADATA_KEY, AotBackend  # noqa: E402
from soagen.runtime.errors import (  # noqa: E402
    BindingError,
    IndexRangeError,
    InputModifiedError,
    ModelLoadError,
)
from tests.helpers import (  # noqa: E402
    REPO,
    TRACK_FACTORY,
    generate_package,
    import_generated,
    run_cli,
)

GNN_SCHEMA = REPO / "schemas" / "gnn.soa"
GNN_FACTORY = "examples/gnn_model.py:build_model"


@pytest.fixture(scope="session")
def gnn_package(gnn_build: tuple[Path, str, str]) -> Path:
    return gnn_build[0]


@pytest.fixture(scope="session")
def gnn(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    root = tmp_path_factory.mktemp("gnn_module")
    generate_package(GNN_SCHEMA, root, "pkg_compile_gnn")
    return import_generated(root, "pkg_compile_gnn", "gnn")


@pytest.fixture(scope="session")
def gnn_model() -> torch.nn.Module:
    sys.path.insert(0, str(REPO))
    try:
        from examples.gnn_model import build_model
    finally:
        sys.path.remove(str(REPO))
    return build_model()


def _gnn_inputs(gnn: ModuleType, n_nodes: int, n_edges: int, seed: int = 0) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(seed)
    nodes = gnn.Nodes.allocate(n_nodes, zero=True)
    edges = gnn.Edges.allocate(n_edges, zero=True)
    nodes.block("node_features").copy_(torch.randn(n_nodes, 4, generator=generator))
    edges.block("edge_index").copy_(
        torch.randint(0, max(n_nodes, 1), (2, n_edges), generator=generator)
    )
    edges.block("edge_features").copy_(torch.randn(n_edges, 2, generator=generator))
    return nodes, edges


# The CLI, end to end.


def test_cli_compile_reports_every_stage(gnn_build: tuple[Path, str, str]) -> None:
    package, stdout, stderr = gnn_build
    for stage in (
        "[1/6] loading schema schemas/gnn.soa",
        "[2/6] building model (examples/gnn_model.py:build_model)",
        "[3/6] exporting with dynamic element counts (torch.export)",
        "[4/6] compiling with AOTInductor for cpu",
        "[5/6] checking the package against the eager model",
        f"[6/6] packaging {package.as_posix()}",
    ):
        assert f"soagen compile: {stage} ...\n" in stderr
        assert f"soagen compile: {stage}: done in " in stderr
    assert "warning" not in stderr  # the schema bounds edge_index (`indexes node_features`)
    assert stdout.startswith(f"wrote {package.as_posix()} (EdgeClassifier for cpu, ")


# Running a package.


@pytest.mark.parametrize(
    ("n_nodes", "n_edges"),
    [(1, 1), (1, 3), (3, 1), (2, 2), (37, 100), (1000, 37), (5000, 5000), (4097, 129)],
)
def test_gnn_package_matches_eager(
    gnn: ModuleType, gnn_model: torch.nn.Module, gnn_package: Path, n_nodes: int, n_edges: int
) -> None:
    compiled = gnn.EdgeClassifier.load(gnn_package)
    eager = gnn.EdgeClassifier(gnn_model)
    assert compiled.backend == "aot"
    nodes, edges = _gnn_inputs(gnn, n_nodes, n_edges, seed=n_nodes + n_edges)
    got, want = gnn.EdgeScores.allocate(n_edges), gnn.EdgeScores.allocate(n_edges)
    compiled(nodes, edges, out=got)
    eager(nodes, edges, out=want)
    torch.testing.assert_close(got.score, want.score)


def test_gnn_package_skips_empty_collections(gnn: ModuleType, gnn_package: Path) -> None:
    """Exported sizes start at 2: a call with nothing to compute runs nothing, not even the
    package's loader, whatever the other collections hold."""
    compiled = gnn.EdgeClassifier.load(gnn_package)
    for n_nodes in (0, 5):
        nodes, edges = _gnn_inputs(gnn, n_nodes, 0)
        compiled(nodes, edges, out=gnn.EdgeScores.allocate(0))
    assert compiled._backend.devices == ()  # never placed: no call reached the package
    nodes, edges = _gnn_inputs(gnn, 5, 3)
    compiled(nodes, edges, out=gnn.EdgeScores.allocate(3))
    assert compiled._backend.devices == (torch.device("cpu"),)


def test_gnn_package_runs_on_slices(
    gnn: ModuleType, gnn_model: torch.nn.Module, gnn_package: Path
) -> None:
    """Slices keep the parent's pitch with fewer elements and a storage offset. (Each slice's edge
    indices number that slice's nodes: `batch_size` refuses index inputs, explicit slices are the
    caller's choice.)"""
    n = 1000
    nodes, edges = _gnn_inputs(gnn, n, n)
    edges.block("edge_index").copy_(torch.randint(0, 32, (2, n)))  # in range of every slice
    got, want = gnn.EdgeScores.allocate(n), gnn.EdgeScores.allocate(n)
    compiled, eager = gnn.EdgeClassifier.load(gnn_package), gnn.EdgeClassifier(gnn_model)
    for start, stop in ((0, 320), (320, 640), (640, 960), (960, 1000), (100, 999)):
        compiled(nodes[start:stop], edges[start:stop], out=got[start:stop])
        eager(nodes[start:stop], edges[start:stop], out=want[start:stop])
        torch.testing.assert_close(got.score[start:stop], want.score[start:stop])


def test_gnn_package_runs_with_batch_size_passing_the_nodes_whole(
    gnn: ModuleType, gnn_model: torch.nn.Module, gnn_package: Path
) -> None:
    """`node_features` is `whole`: batch_size slices the edges and the scores, each slice gets all
    nodes, and `edge_index` (which indexes the nodes) stays valid in every slice."""
    nodes, edges = _gnn_inputs(gnn, 300, 1000, seed=5)
    compiled, eager = gnn.EdgeClassifier.load(gnn_package), gnn.EdgeClassifier(gnn_model)
    expected, batched = gnn.EdgeScores.allocate(1000), gnn.EdgeScores.allocate(1000)
    eager(nodes, edges, out=expected, batch_size=100)
    compiled(nodes, edges, out=batched, batch_size=100)
    torch.testing.assert_close(batched.score, expected.score)


def test_inputs_go_in_without_copies(gnn: ModuleType, gnn_package: Path) -> None:
    """No copy, clone or contiguous of an input runs inside the runner. (The compiled model's own
    aten calls, such as copying a bias into an addmm output, do run: they have other shapes.)"""
    from torch.profiler import ProfilerActivity, profile

    backend = AotBackend(gnn_package, gnn.EdgeClassifier)
    runner = backend.on(torch.device("cpu"))
    nodes, edges = _gnn_inputs(gnn, 1000, 3000)
    views = [nodes.block("node_features"), edges.block("edge_index")]
    views.append(edges.block("edge_features"))
    assert views[0].stride() == (1, 1024) and views[2].stride() == (1, 3008)  # SoA, not contiguous
    input_shapes = [list(view.shape) for view in views]
    with torch.inference_mode():
        runner(views)  # warm up
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            results = runner(views)
    assert isinstance(results, list) and results[0].shape == (3000,)
    names = {event.name for event in prof.events()}
    assert not names & {"aten::clone", "aten::contiguous", "aten::_to_copy"}
    for event in prof.events():
        if event.name == "aten::copy_":
            assert not any(shape in input_shapes for shape in event.input_shapes), event
    # The package itself has no kernel that copies an input into a contiguous layout: no call of
    # a clone (`aoti_torch_clone...(`); the word alone may be in a path of its build command.
    with zipfile.ZipFile(gnn_package) as archive:
        sources = [archive.read(n) for n in archive.namelist() if n.endswith("wrapper.cpp")]
    assert sources and not any(re.search(rb"clone\w*\(", source) for source in sources)


def test_a_package_loads_in_a_fresh_process_first(gnn_package: Path, tmp_path: Path) -> None:
    # What `soagen compile` does for a GPU package before it loads it in its own process (here
    # on CPU). A child that fails without crashing proves nothing: its last line comes back.
    import soagen.build.compile as compile_module

    assert compile_module.loads_in_a_fresh_process(gnn_package, torch.device("cpu")) is None
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"not a zip archive")
    said = compile_module.loads_in_a_fresh_process(broken, torch.device("cpu"))
    assert said is not None and "zip" in said.lower()


@pytest.mark.parametrize(
    ("child", "expected"),
    [
        ("os.kill(os.getpid(), signal.SIGSEGV)", r"AOTInductor loader crashed \(SIGSEGV\)"),
        ("os.kill(os.getpid(), signal.SIGKILL)", r"was stopped \(SIGKILL\)"),
        ("time.sleep(60)", r"did not load the package .* within 1 s"),
    ],
    ids=["crash", "killed", "hang"],
)
def test_a_loader_that_ends_its_process_is_a_compile_error(
    gnn_package: Path, monkeypatch: pytest.MonkeyPatch, child: str, expected: str
) -> None:
    # The child made to crash (as torch 2.11's loader did on CUDA packages), be killed or hang.
    import soagen.build.compile as compile_module

    monkeypatch.setattr(compile_module, "_LOAD_IN_CHILD", f"import os, signal, time; {child}")
    monkeypatch.setattr(compile_module, "_CHILD_LOAD_S", 1)
    with pytest.raises(CompileError, match=expected) as raised:
        compile_module.loads_in_a_fresh_process(gnn_package, torch.device("cpu"))
    assert "was not written" in str(raised.value)


def test_compile_writes_nothing_when_the_child_loading_its_package_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU packages only are loaded in a child first; here CPU ones too, the child made to crash.
    import soagen.build.compile as compile_module

    monkeypatch.setattr(compile_module, "_IN_PROCESS_LOADS", frozenset())
    monkeypatch.setattr(
        compile_module, "_LOAD_IN_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    )
    (tmp_path / "sums.soa").write_text(WRITER_SCHEMA)
    (tmp_path / "sums_model.py").write_text(SUMS_FACTORY)
    out = tmp_path / "out"
    with pytest.raises(CompileError, match=r"crashed \(SIGSEGV\).*was not written"):
        compile_model(
            tmp_path / "sums.soa",
            "Writer",
            f"{tmp_path / 'sums_model.py'}:build",
            output=out / "s.pt2",
        )
    assert list(out.iterdir()) == []  # no package, no staging file


SUMS_FACTORY = """
import torch


class Sums(torch.nn.Module):
    def forward(self, points):
        return points.sum(1)


def build():
    return Sums()
"""


def test_one_package_from_eight_threads(
    gnn: ModuleType, gnn_model: torch.nn.Module, gnn_package: Path
) -> None:
    compiled = gnn.EdgeClassifier.load(gnn_package)
    cases = [_gnn_inputs(gnn, 50 + 7 * i, 300 + 11 * i, seed=i) for i in range(8)]
    expected = []
    for nodes, edges in cases:
        scores = gnn.EdgeScores.allocate(edges.size)
        gnn.EdgeClassifier(gnn_model)(nodes, edges, out=scores)
        expected.append(scores.score.clone())
    failures: list[BaseException] = []

    def work(i: int) -> None:
        nodes, edges = cases[i]
        try:
            for _ in range(20):
                scores = gnn.EdgeScores.allocate(edges.size)
                compiled(nodes, edges, out=scores)
                torch.testing.assert_close(scores.score, expected[i])
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]


def test_a_package_refuses_contiguous_copies(gnn: ModuleType, gnn_package: Path) -> None:
    # It was exported for the views' strides; a row-major copy would fail its stride check at
    # every call with a message about exported strides.
    with pytest.raises(BindingError, match="compiled for the collections' strided views"):
        gnn.EdgeClassifier.load(gnn_package, contiguous=["edge_features"])


def test_recorded_index_bounds_come_back(gnn: ModuleType, gnn_package: Path) -> None:
    # The factory declares no bounds: the schema's `indexes node_features` is recorded.
    compiled = gnn.EdgeClassifier.load(gnn_package)
    assert dict(compiled._backend.index_bounds) == {"edge_index": "node_features"}
    assert compiled.index_bounds == {"edge_index": "node_features"}
    nodes, edges = _gnn_inputs(gnn, 10, 20)
    edges.block("edge_index")[1, 5] = 10
    with pytest.raises(IndexRangeError, match="outside \\[0, 10\\)"):
        compiled(nodes, edges, out=gnn.EdgeScores.allocate(20))


def test_a_cpu_package_checks_its_index_ranges_before_it_runs(
    gnn: ModuleType, gnn_package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The range check is compiled into a CPU package, so every call leaves it to the
    package, with a plan or without: no Python check before it runs. A bad index is still
    refused with the values named (checked in Python once the package refused it), and nothing
    is written."""
    import soagen.runtime.model as binding_module

    compiled = gnn.EdgeClassifier.load(gnn_package)
    assert dict(compiled._backend.index_ranges_checked) == {"edge_index": "node_features"}
    checked: list[str] = []
    python_check = binding_module._check_index_range

    def counted(*arguments: Any, **options: Any) -> None:
        checked.append(arguments[1])
        python_check(*arguments, **options)

    monkeypatch.setattr(binding_module, "_check_index_range", counted)
    nodes, edges = _gnn_inputs(gnn, 10, 20)
    out = gnn.EdgeScores.allocate(20)
    compiled(nodes, edges, out=out)
    assert checked == []  # a first call leaves it to the package too
    compiled(nodes, edges, out=out)  # makes the plan
    (plan,) = compiled._plans.values()
    assert plan.index_checks == ()
    assert [check[1] for check in plan.model_index_checks] == ["edge_index"]
    checked.clear()
    expected = out.score.clone()
    compiled(nodes, edges, out=out)
    assert checked == []
    torch.testing.assert_close(out.score, expected)
    indices = edges.block("edge_index")
    for where, value, shown in (((1, 19), 10, "0..10"), ((0, 0), -1, "-1..")):
        kept = int(indices[where])
        compiled(nodes, edges, out=out)  # the plan again
        indices[where] = value
        out.score.fill_(-7)
        with pytest.raises(IndexRangeError, match=rf"outside \[0, 10\).*values {shown}") as error:
            compiled(nodes, edges, out=out)
        assert isinstance(error.value.__context__, RuntimeError)  # the package refused it first
        assert checked[-1] == "edge_index" and not compiled._plans
        assert bool((out.score == -7).all())
        indices[where] = kept
    # A call without a plan (a new event's collections) names them too, and writes nothing.
    kept = int(indices[1, 7])
    indices[1, 7] = 12
    new_out = gnn.EdgeScores.allocate(20)
    new_out.score.fill_(-7)
    with pytest.raises(IndexRangeError, match=r"outside \[0, 10\).*values \d+\.\.12") as error:
        compiled(
            type(nodes).wrap(nodes.buffer, 10), type(edges).wrap(edges.buffer, 20), out=new_out
        )
    assert isinstance(error.value.__context__, RuntimeError)
    assert bool((new_out.score == -7).all())
    indices[1, 7] = kept
    views = [nodes.block("node_features"), indices, edges.block("edge_features")]
    indices[0, 3] = 10
    with pytest.raises(RuntimeError, match=r"'edge_index' holds indices outside \[0, n\)"):
        compiled._backend.on(torch.device("cpu"))(views)  # the package alone


def test_the_build_refuses_a_package_whose_index_check_does_not_hold(gnn: ModuleType) -> None:
    """Doubles of the package's runner: one that refuses every bad index passes, and each value
    tried is put back; one that checks only the first element, one that checks nothing and one
    that writes its outputs before refusing are each refused."""
    from soagen.build.compile import verify_index_checks

    binding, bounds = gnn.EdgeClassifier, {"edge_index": "node_features"}
    nodes, edges = _gnn_inputs(gnn, 10, 20)
    inputs = [nodes.block("node_features"), edges.block("edge_index"), edges.block("edge_features")]
    outputs = [gnn.EdgeScores.allocate(20).block("edge_scores")]
    original = inputs[1].clone()
    tried: list[tuple[int, int]] = []

    def refusing(arguments: list[torch.Tensor]) -> None:
        indices = arguments[1]
        tried.append((int(indices.min()), int(indices.max())))
        if bool(((indices < 0) | (indices >= 10)).any()):
            raise RuntimeError("refused")

    verify_index_checks(binding, refusing, inputs, outputs, bounds)
    assert sorted(tried) == sorted([(-1, 9), (-1, 9), (0, 10), (0, 10)])  # two corners, two values
    assert torch.equal(inputs[1], original)

    def first_only(arguments: list[torch.Tensor]) -> None:
        if not 0 <= int(arguments[1][0, 0]) < 10:
            raise RuntimeError("refused")

    def writes_first(arguments: list[torch.Tensor]) -> None:
        arguments[-1].zero_()
        refusing(arguments)

    for runner, message in (
        (first_only, r"holding 10 at \[1, 19\] \('node_features' holds 10 elements\): .* not fire"),
        (lambda arguments: None, r"holding 10 at \[0, 0\].*did not fire"),
        (writes_first, "wrote into its output blocks before the index range check"),
    ):
        with pytest.raises(CompileError, match=message):
            verify_index_checks(binding, runner, inputs, outputs, bounds)
        assert torch.equal(inputs[1], original)


def test_index_checks_go_into_cpu_packages_for_the_dtypes_inductor_compares() -> None:
    from types import SimpleNamespace

    from soagen.build.compile import index_checks_in_package

    def spec(name: str, dtype: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, block=SimpleNamespace(dtype=dtype))

    class Binding:
        INPUTS = (spec("points", "float32"), spec("small", "int32"), spec("wide", "uint32"))

    bounds = {"small": "points", "wide": "points"}
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert index_checks_in_package(Binding, bounds, cpu) == {"small": "points"}  # type: ignore[arg-type]
    assert index_checks_in_package(Binding, bounds, cuda) == {}  # type: ignore[arg-type]


def test_integer_inputs_without_a_bound_are_named(gnn: ModuleType) -> None:
    from soagen.build.compile import unbounded_index_inputs
    from soagen.build.model import resolve_index_bounds

    binding = gnn.EdgeClassifier
    assert unbounded_index_inputs(binding, {}) == ["edge_index"]
    schema_bounds = resolve_index_bounds(binding, None, ModuleType("factory_without_bounds"))
    assert schema_bounds == {"edge_index": "node_features"}
    assert unbounded_index_inputs(binding, schema_bounds) == []


def test_runner_refuses_inputs_the_package_was_not_exported_for(
    gnn: ModuleType, gnn_package: Path
) -> None:
    """AOTInductor checks nothing at run time: the runner checks sizes against the export."""
    compiled = gnn.EdgeClassifier.load(gnn_package)
    nodes, edges = _gnn_inputs(gnn, 10, 20)
    _, other_edges = _gnn_inputs(gnn, 10, 21)
    with pytest.raises(BindingError, match="exported with them equal"):
        compiled.run(
            {"node_features": nodes, "edge_index": edges, "edge_features": other_edges},
            {"edge_scores": gnn.EdgeScores.allocate(20)},
        )
    runner = compiled._backend.on(torch.device("cpu"))
    with pytest.raises(BindingError, match="takes torch.float32 with 2 axes"):
        runner([torch.zeros(10, 4, dtype=torch.float64), *[edges.block("edge_index")] * 2])


def test_track_package_matches_eager(tracks: tuple[ModuleType, Path, Path]) -> None:
    module, factory, package = tracks
    import importlib.util

    spec = importlib.util.spec_from_file_location("track_model_for_test", factory)
    assert spec is not None and spec.loader is not None
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    compiled = module.TrackNet.load(package)
    eager = module.TrackNet(source.build())
    assert compiled.index_bounds == {}
    for n in (1, 2, 3, 16, 17, 100, 1001):
        generator = torch.Generator().manual_seed(n)
        tracks_in = module.Tracks.allocate(n)
        tracks_in.block("momentum").copy_(torch.randn(3, n, generator=generator))
        tracks_in.cov.copy_(torch.randn(n, 3, 3, generator=generator))
        tracks_in.bfield.fill_(3.8)
        got, want = module.TrackOut.allocate(n), module.TrackOut.allocate(n)
        compiled(tracks_in, out=got)
        eager(tracks_in, out=want)
        torch.testing.assert_close(got.block("features"), want.block("features"))
        torch.testing.assert_close(got.q, want.q)
        assert got.q.abs().max() <= 1
        # Into a slice of a larger collection: the outputs' pitch is not n's.
        larger = module.TrackOut.allocate(n + 100, zero=True)
        compiled(tracks_in, out=larger.slice(50, 50 + n))
        torch.testing.assert_close(larger.slice(50, 50 + n).q, want.q)
        assert not larger.q[:50].any() and not larger.q[50 + n :].any()


def test_a_planned_call_of_a_package_that_writes_its_outputs_is_one_call_of_its_runner(
    tracks: tuple[ModuleType, Path, Path],
) -> None:
    """Nothing is left to Python there (no index input, no counter, no write-back): the plan binds
    the runner to its arguments once, and each call sees the collections' new values."""
    module, _, package = tracks
    planned = module.TrackNet.load(package)
    tracks_in, out = module.Tracks.allocate(30), module.TrackOut.allocate(30)
    tracks_in.cov.copy_(torch.eye(3).expand(30, 3, 3))
    for seed in range(3):
        tracks_in.block("momentum").copy_(
            torch.randn(3, 30, generator=torch.Generator().manual_seed(seed))
        )
        tracks_in.bfield.fill_(seed)
        planned(tracks_in, out=out)
        want = module.TrackOut.allocate(30)
        module.TrackNet.load(package)(tracks_in, out=want)  # a first call: no plan
        torch.testing.assert_close(out.block("features"), want.block("features"))
        torch.testing.assert_close(out.q, want.q)
    (plan,) = planned._plans.values()
    # The package's runner, its argument check made once, bound to its arguments: no Python
    # frame between.
    runner = planned._backend.on(torch.device("cpu"))
    assert plan.call is not None and plan.call.func is getattr(runner, "unchecked", runner)
    assert [t.data_ptr() for t in plan.call.args[0]] == [
        *(t.data_ptr() for t in plan.views),
        *(out.block(block).data_ptr() for _, block in planned._output_blocks),
    ]

    def failing() -> None:
        raise RuntimeError("the runner failed")

    plan.call = failing
    with pytest.raises(RuntimeError, match="the runner failed"):
        planned(tracks_in, out=out)
    assert not planned._plans  # a failed call drops its plan


def test_misaligned_output_blocks_of_a_writing_package_are_staged(
    tracks: tuple[ModuleType, Path, Path],
) -> None:
    """A CUDA package writing a block that starts off its 16-byte alignment would write a clone
    nobody reads: such blocks are staged. The staging is device-independent, so CPU checks it
    with a stricter alignment than any CPU block here has."""
    module, _, package = tracks
    plain, staged = module.TrackNet.load(package), module.TrackNet.load(package)
    assert staged._backend.output_alignment is None  # a CPU package needs no staging
    staged._backend.output_alignment = 1 << 20
    tracks_in = module.Tracks.allocate(30)
    tracks_in.block("momentum").copy_(
        torch.randn(3, 30, generator=torch.Generator().manual_seed(3))
    )
    tracks_in.cov.copy_(torch.eye(3).expand(30, 3, 3))
    tracks_in.bfield.fill_(3.8)
    want = module.TrackOut.allocate(30)
    plain(tracks_in, out=want)
    larger = module.TrackOut.allocate(37, zero=True)
    got = larger.slice(7, 37)
    assert got.q.data_ptr() % (1 << 20)
    staged(tracks_in, out=got)
    torch.testing.assert_close(got.q, want.q)
    torch.testing.assert_close(got.block("features"), want.block("features"))
    assert not larger.q[:7].any()


def test_a_package_that_writes_outputs_checks_them_and_needs_them(
    tracks: tuple[ModuleType, Path, Path],
) -> None:
    module, _, package = tracks
    compiled = module.TrackNet.load(package)
    assert compiled._backend.writes_outputs
    tracks_in = module.Tracks.allocate(20)
    with pytest.raises(
        BindingError, match="size of output 'features' along axis n is 21, but the size of input"
    ):
        compiled(tracks_in, out=module.TrackOut.allocate(21))
    views = [tracks_in.block(spec.block) for spec in module.TrackNet.INPUTS]
    with pytest.raises(BindingError, match=r"takes 5 tensors \(momentum, cov, bfield, features"):
        compiled._backend.on(torch.device("cpu"))(views)  # the output blocks missing
    with pytest.raises(BindingError, match="writes its results into output blocks"):
        compiled._evaluate(
            {"momentum": tracks_in, "cov": tracks_in, "bfield": tracks_in}, tracks_in.device, None
        )


def test_a_package_records_its_output_counts_from_its_exported_geometry(gnn: ModuleType) -> None:
    # What `soagen compile --write-outputs` records for the GNN (inputs of two layouts): each
    # block's sizes in declared order, the element axis a symbol per layout, or a number where an
    # output's count is fixed. A server sizes the output collections it allocates by it.
    package = AotBackend.__new__(AotBackend)
    package.binding, package.writes_outputs = gnn.EdgeClassifier, True
    inputs = [{"sizes": ["s0", "4"]}, {"sizes": ["2", "s1"]}, {"sizes": ["s1", "2"]}]
    package.metadata = {"input_geometry": [*inputs, {"sizes": ["s1"]}]}
    assert package.output_counts == {"edge_scores": "edge_index"}
    package.metadata = {"input_geometry": [*inputs, {"sizes": ["1"]}]}
    assert package.output_counts == {"edge_scores": "1"}
    package.metadata = {"input_geometry": [*inputs, {"sizes": ["s1 + 1"]}]}
    assert package.output_counts == {}  # no input's count: nothing recorded
    package.metadata = {"input_geometry": inputs}  # an older package, inputs only
    assert package.output_counts == {}
    package.writes_outputs = False
    package.metadata = {"input_geometry": [*inputs, {"sizes": ["s1"]}]}
    assert package.output_counts == {}


def test_a_server_allocates_the_outputs_a_writing_package_stores_into(
    tracks: tuple[ModuleType, Path, Path],
) -> None:
    # `soagen serve`'s function for each event of a Triton execution, in this process: the
    # output collection (TrackOut, a layout of its own) gets as many elements as the one input
    # layout's, and the answer is what a local call of the package writes, bit for bit.
    from soagen.serving.errors import ServeError
    from soagen.serving.server import EventRunner, LoadedBinding, build_binding
    from soagen.serving.wire import ERROR_OUTPUT, wire_tensor

    module, _, package = tracks
    loaded = LoadedBinding(module.TrackNet, {"Tracks": module.Tracks, "TrackOut": module.TrackOut})
    served = build_binding(loaded, model_file=package)
    assert served._backend.writes_outputs
    runner = EventRunner(served, loaded.layouts, "cpu")
    local = module.TrackNet.load(package)
    generator = torch.Generator().manual_seed(5)
    requests, expected = [], []
    for n in (1, 30, 77):
        tracks_in = module.Tracks.allocate(n)
        tracks_in.block("momentum").copy_(torch.randn(3, n, generator=generator))
        tracks_in.cov.copy_(torch.randn(n, 3, 3, generator=generator))
        tracks_in.bfield.fill_(3.8)
        data = {}
        for spec in module.TrackNet.INPUTS:
            wire = wire_tensor(spec)
            data[wire.name] = tracks_in.block(spec.block).permute(wire.order).contiguous()
            data[wire.name] = data[wire.name].numpy()[None]
        requests.append(type("Request", (), {"data": data})())
        out = module.TrackOut.allocate(n, zero=True)
        local(tracks_in, out=out)
        expected.append(out)
    answers = runner(requests)
    for answer, out in zip(answers, expected, strict=True):
        assert answer[ERROR_OUTPUT].tolist() == [[b""]]
        for spec in module.TrackNet.OUTPUTS:
            wire = wire_tensor(spec)
            want = out.block(spec.block).permute(wire.order).contiguous()
            assert torch.equal(torch.from_numpy(answer[wire.name][0]), want), spec.name
    assert runner(requests[:1])[0]["charge"].shape == (1, 1)
    # The package records its outputs' counts (the symbol of the inputs' n): a size that agrees
    # (another input of the same layout) is taken, one that differs is refused at start.
    assert served._backend.output_counts == {"features": "momentum", "charge": "momentum"}
    EventRunner(served, loaded.layouts, "cpu", {"charge": "cov"})
    with pytest.raises(ServeError, match="'charge' share the TrackOut collection"):
        EventRunner(served, loaded.layouts, "cpu", {"charge": "5"})
    with pytest.raises(ServeError, match=r"'features' would get 5 elements per event, and the"):
        EventRunner(served, loaded.layouts, "cpu", {"features": "5", "charge": "5"})
    with pytest.raises(ServeError, match=r"'nothing' is neither an input of TrackNet"):
        EventRunner(served, loaded.layouts, "cpu", {"charge": "nothing"})
    with pytest.raises(ServeError, match="no layout class for TrackOut"):
        EventRunner(served, {"Tracks": module.Tracks}, "cpu")


WRITER_SCHEMA = """
layout Hits {
    column float32 x, y
}

layout Sums {
    column float32 total
}

model Writer {
    input  points = Hits{x, y} as [n, c]
    output total  = Sums{total}
}
"""

WRITER_FACTORY = """
import torch


class ZeroesFirstColumn(torch.nn.Module):
    # Some real taggers write into their inputs (`points *= mask`); a package would do it too.
    def forward(self, points):
        points[:, 0] = 0
        return points.sum(1)


def build():
    return ZeroesFirstColumn()
"""


def test_a_model_that_writes_its_inputs_compiles_into_a_package_that_needs_protection(
    tmp_path: Path,
) -> None:
    (tmp_path / "writer.soa").write_text(WRITER_SCHEMA)
    (tmp_path / "writer_model.py").write_text(WRITER_FACTORY)
    lines: list[str] = []
    package = compile_model(
        tmp_path / "writer.soa",
        "Writer",
        f"{tmp_path / 'writer_model.py'}:build",
        output=tmp_path / "writer.pt2",
        progress=lines.append,
    )
    # The check against eager ran on copies, so the package compiled (it used to disagree with an
    # eager run that had already zeroed the inputs) and says what it writes.
    assert any("writes into its input(s) points" in line for line in lines)
    generate_package(tmp_path / "writer.soa", tmp_path, "pkg_compile_writer")
    module = import_generated(tmp_path, "pkg_compile_writer", "writer")
    assert AotBackend(package, module.Writer).writes_inputs == ("points",)
    with pytest.raises(InputModifiedError, match=r"writes into its input\(s\) 'points'.*protect"):
        module.Writer.load(package)
    hits = module.Hits.allocate(50)
    hits.block("points").copy_(torch.randn(50, 2, generator=torch.Generator().manual_seed(5)))
    before = hits.buffer.clone()
    points = hits.block("points").clone()
    sums = module.Sums.allocate(50)
    module.Writer.load(package, protect_inputs=True)(hits, out=sums)
    assert torch.equal(hits.buffer, before)  # the caller's bytes as they were
    torch.testing.assert_close(sums.total, points[:, 1])
    # Serving loads packages as they are: `soagen triton` and `soagen serve` say so up front.
    status, _, stderr = run_cli(
        "triton", str(tmp_path / "writer.soa"), "--model", "Writer", "--runtime", "aot",
        "--package", str(package), "-o", str(tmp_path / "repo"),
    )  # fmt: skip
    assert status == 2 and "writes into its input(s) points" in stderr, stderr
    status, _, stderr = run_cli(
        "triton", str(tmp_path / "writer.soa"), "--model", "Writer", "--runtime", "aot",
        "--factory", f"{tmp_path / 'writer_model.py'}:build", "-o", str(tmp_path / "repo"),
    )  # fmt: skip
    assert status == 2 and "writes into its input(s) points" in stderr, stderr
    assert not (tmp_path / "repo" / "Writer").exists()
    from soagen.serving.errors import ServeError
    from soagen.serving.server import LoadedBinding, build_binding

    loaded = LoadedBinding(module.Writer, {"Hits": module.Hits, "Sums": module.Sums})
    with pytest.raises(ServeError, match="writes into its input"):
        build_binding(loaded, model_file=package)


def test_writes_the_example_does_not_reach_show_in_the_exported_graph(
    gnn: ModuleType,
) -> None:
    from soagen.build.compile import _inputs_written, _TorchLog

    class WritesSecondInput(torch.nn.Module):
        def forward(self, nodes: Any, edge_index: Any, edges: Any) -> Any:
            edges.mul_(2)
            return edges.sum(1)

    arguments = (torch.randn(5, 4), torch.zeros(2, 7, dtype=torch.int64), torch.randn(7, 2))
    exported = torch.export.export(WritesSecondInput(), arguments)
    # No eager run saw it (`seen` is empty): the functional graph still names the input.
    log = _TorchLog(Path("unused.compile.log"))
    assert _inputs_written(gnn.EdgeClassifier, exported, set(), log) == ["edge_features"]
    assert _inputs_written(gnn.EdgeClassifier, exported, {0}, log) == [
        "node_features",
        "edge_features",
    ]


def test_track_package_records_symbolic_strides(tracks: tuple[ModuleType, Path, Path]) -> None:
    module, _, package = tracks
    metadata = AotBackend(package, module.TrackNet).metadata
    momentum, cov, bfield, features, charge = metadata["input_geometry"]  # inputs, outputs
    # Pitches are symbols of their own, read from the tensors; array strides follow from them.
    assert momentum["sizes"][0] == "3" and momentum["strides"][1] == "1"
    assert momentum["strides"][0].isidentifier()
    pitch = cov["strides"][1]
    assert cov["strides"][0] == "1" and pitch.isidentifier()
    assert cov["strides"][2] == f"3*{pitch}"
    assert bfield["strides"] == ["0"]
    assert metadata["example_sizes"] == {"Tracks": 64 * 16 + 1}
    assert metadata["columnwise"] == ["mix"]
    # The output blocks it writes: [c, n] and [n], their pitch a symbol of its own.
    assert metadata["writes_outputs"] is True
    out_pitch = features["strides"][0]
    assert out_pitch.isidentifier() and out_pitch not in (pitch, momentum["strides"][0])
    assert features["strides"][1] == "1" and charge["strides"] == ["1"]


# Refusing packages built for something else.


def _variant(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


GNN_TEXT = GNN_SCHEMA.read_text()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "layout Nodes {\n    align 128",
            "layout Nodes {\n    align 64",
            "input 'node_features': the byte layout of Nodes differs",
        ),
        (
            "    column int64 src, dst\n    column float32 delta_r, delta_eta\n",
            "    column float32 delta_r, delta_eta\n    column int64 src, dst\n",
            "input 'edge_index': the byte layout of Edges differs",
        ),
        (
            "Nodes{x, y, z, energy}    as [n, c]",
            "Nodes{x, y, z}            as [n, c]",
            "input 'node_features': members x, y, z, energy in the package, x, y, z here",
        ),
        (
            "Edges{src, dst}           as [c, n]",
            "Edges{src, dst}           as [n, c]",
            "input 'edge_index': axes c, n in the package, n, c here",
        ),
        (
            "output edge_scores   = EdgeScores{score}",
            "output scores        = EdgeScores{score}",
            "its outputs are edge_scores; EdgeClassifier's are scores",
        ),
        ("model EdgeClassifier", "model EdgeScorer", "it is model 'EdgeClassifier'"),
    ],
)
def test_load_refuses_a_package_for_another_schema(
    generated_from_text: Callable[[str], ModuleType],
    gnn_package: Path,
    old: str,
    new: str,
    message: str,
) -> None:
    module = generated_from_text(_variant(GNN_TEXT, old, new))
    binding = getattr(module, "EdgeScorer" if "EdgeScorer" in new else "EdgeClassifier")
    with pytest.raises(ModelLoadError, match="built for another schema or layout") as caught:
        binding.load(gnn_package)
    assert message in str(caught.value)
    assert "Rebuild it with `soagen compile`" in str(caught.value)


def _rewrite_metadata(source: Path, target: Path, change: Callable[[dict[str, str]], None]) -> Path:
    """A copy of a package whose AOTInductor metadata files went through `change`."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename.endswith("_metadata.json"):
                entries = json.loads(data)
                change(entries)
                data = json.dumps(entries).encode()
            new.writestr(info, data)
    return target


def _change_soagen(**fields: object) -> Callable[[dict[str, str]], None]:
    def change(entries: dict[str, str]) -> None:
        metadata = json.loads(entries[METADATA_KEY])
        metadata.update(fields)
        entries[METADATA_KEY] = json.dumps(metadata)

    return change


def test_load_refuses_a_package_not_built_by_soagen(
    gnn: ModuleType, gnn_package: Path, tmp_path: Path
) -> None:
    plain = _rewrite_metadata(
        gnn_package, tmp_path / "plain.pt2", lambda entries: entries.pop(METADATA_KEY)
    )
    with pytest.raises(ModelLoadError, match="not built by `soagen compile`"):
        gnn.EdgeClassifier.load(plain)


def test_load_refuses_another_torch_or_soagen(
    gnn: ModuleType, gnn_package: Path, tmp_path: Path
) -> None:
    old_torch = _rewrite_metadata(
        gnn_package, tmp_path / "torch.pt2", _change_soagen(torch_version="2.12.1+cu126")
    )
    with pytest.raises(ModelLoadError, match="compiled with torch 2.12.1\\+cu126, but torch"):
        gnn.EdgeClassifier.load(old_torch)
    old_soagen = _rewrite_metadata(
        gnn_package, tmp_path / "soagen.pt2", _change_soagen(soagen_version="0.0.9")
    )
    with pytest.raises(ModelLoadError, match="built by soagen 0.0.9"):
        gnn.EdgeClassifier.load(old_soagen)
    # Another build of the same torch release is fine.
    same = _rewrite_metadata(
        gnn_package, tmp_path / "same.pt2", _change_soagen(torch_version=torch.__version__ + "x")
    )
    if "+" in torch.__version__:
        gnn.EdgeClassifier.load(same)


@pytest.mark.parametrize(
    "entry, value, message",
    [
        ("AOTI_MACHINE", "aarch64", "compiled for aarch64 CPUs"),
        ("AOTI_CPU_ISA", "AVX1024 FUTURE", None),  # unknown extensions: nothing to compare
    ],
)
def test_load_checks_the_cpu_the_package_was_built_for(
    gnn: ModuleType,
    gnn_package: Path,
    tmp_path: Path,
    entry: str,
    value: str,
    message: str | None,
) -> None:
    def change(entries: dict[str, str]) -> None:
        entries[entry] = value

    package = _rewrite_metadata(gnn_package, tmp_path / "machine.pt2", change)
    if message is None:
        gnn.EdgeClassifier.load(package)
        return
    with pytest.raises(ModelLoadError, match=message):
        gnn.EdgeClassifier.load(package)


@pytest.mark.parametrize(
    ("built", "here", "missing"),
    [
        ("AVX512", {"avx2", "fma"}, "AVX512"),
        ("AVX512 AVX512_VNNI", {"avx2", "avx512f"}, "AVX512_VNNI"),  # the level alone matches
        ("AVX512 AVX512_VNNI AMX_TILE", {"avx512f", "avx512_vnni"}, "AMX_TILE"),
        ("AVX2", {"avx2"}, None),
    ],
)
def test_load_refuses_a_package_for_extensions_this_cpu_lacks(
    gnn: ModuleType,
    gnn_package: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    built: str,
    here: set[str],
    missing: str | None,
) -> None:
    """The machine code would die on an illegal instruction. This CPU's flags are replaced, so the
    refusal is checked on any machine."""
    from soagen.runtime import aot

    def change(entries: dict[str, str]) -> None:
        entries["AOTI_CPU_ISA"] = built
        _change_soagen(cpu_flags=None)(entries)  # as a package of soagen 0.2.0 has it

    package = _rewrite_metadata(gnn_package, tmp_path / "isa.pt2", change)
    monkeypatch.setattr(aot, "cpu_flags", lambda: frozenset(here))
    if missing is None:
        gnn.EdgeClassifier.load(package)
        return
    with pytest.raises(
        ModelLoadError, match=f"compiled for CPUs with {built}; this CPU lacks {missing}"
    ):
        gnn.EdgeClassifier.load(package)


@pytest.mark.skipif(
    not (os.path.exists("/proc/cpuinfo") and platform.machine() in ("x86_64", "AMD64")),
    reason="x86 flags of /proc/cpuinfo",
)
def test_load_refuses_a_package_built_on_a_cpu_with_extensions_this_one_lacks(
    gnn: ModuleType, gnn_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-march=native` lets the compiler use every extension of the build machine's CPU, not only
    the level AOTI_CPU_ISA names (AVX512 says nothing of avx512_fp16): the package records them
    all, and a CPU lacking any of them is refused. This CPU's flags are replaced, so the refusal is
    checked on any machine."""
    from soagen.runtime import aot

    recorded = aot.read_metadata(gnn_package)["cpu_flags"]
    assert recorded == aot.instruction_sets()  # this machine built it
    assert "sse2" in recorded and "lm" not in recorded  # extensions only, not other cpuinfo flags
    newer = _rewrite_metadata(
        gnn_package,
        tmp_path / "newer.pt2",
        _change_soagen(cpu_flags=[*recorded, "avx512_fp16", "amx_fp16"]),
    )
    with pytest.raises(
        ModelLoadError,
        match=r"compiled \(-march=native\) on a CPU with avx512_fp16 amx_fp16, which this CPU lacks",
    ):
        gnn.EdgeClassifier.load(newer)
    # A CPU with more extensions than the build's runs it; one whose flags are unknown is not judged.
    monkeypatch.setattr(
        aot, "cpu_flags", lambda: frozenset([*recorded, "avx512_fp16", "amx_fp16", "x"])
    )
    gnn.EdgeClassifier.load(newer)
    monkeypatch.setattr(aot, "cpu_flags", lambda: None)
    gnn.EdgeClassifier.load(newer)


def test_only_native_builds_record_the_cpus_extensions() -> None:
    """A package built for a named target (`TORCHINDUCTOR_CPP_MARCH=x86-64-v3`) is meant to run
    on other CPUs than this one: its load is not held to this CPU's extensions. (Inductor's own
    `config.patch`: its config objects do not survive monkeypatch's undo.)"""
    from torch._inductor import config

    from soagen.build.compile import native_instruction_sets
    from soagen.runtime.aot import instruction_sets

    before = config.cpp.march
    with config.patch({"cpp.march": None}):
        assert native_instruction_sets() == instruction_sets()
    with config.patch({"cpp.march": "x86-64-v3"}):
        assert native_instruction_sets() is None
    assert config.cpp.march == before  # put back for the package compiles of later tests


def test_package_for_another_device_refuses_to_run_here(
    gnn: ModuleType, gnn_package: Path, tmp_path: Path
) -> None:
    cuda = _rewrite_metadata(gnn_package, tmp_path / "cuda.pt2", _change_soagen(device="cuda"))
    compiled = gnn.EdgeClassifier.load(cuda)
    nodes, edges = _gnn_inputs(gnn, 4, 4)
    with pytest.raises(ModelLoadError, match="compiled for cuda; it cannot run on cpu"):
        compiled(nodes, edges, out=gnn.EdgeScores.allocate(4))


# Argument errors: all found before anything is exported.


def test_parse_pairs() -> None:
    from soagen.cli.common import UsageError, parse_pairs

    assert parse_pairs(["edge_index=node_features", " a = b "], "--index", "x=y") == {
        "edge_index": "node_features",
        "a": "b",
    }
    for bad in ("edge_index", "=x", "a=b=c", "a-b=c", "a=5"):  # counts only with counts=True
        with pytest.raises(UsageError, match=f"--index takes INDEX=BOUND .*; got '{bad}'"):
            parse_pairs([bad], "--index", "x=y")
    with pytest.raises(UsageError, match="--index gives 'a' twice"):
        parse_pairs(["a=b", "a=c"], "--index", "x=y")
    sizes = ["scores=7", "other=edges"]
    assert parse_pairs(sizes, "--output-size", "x=y", counts=True) == {
        "scores": "7",
        "other": "edges",
    }
    for bad in ("scores=0", "scores=-5"):
        with pytest.raises(UsageError, match=f"--output-size {bad}: an element count must be >= 1"):
            parse_pairs([bad], "--output-size", "x=y", counts=True)


def _cli_compile(tmp_path: Path, *extra: str, factory: str = GNN_FACTORY) -> tuple[int, str]:
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        status, _, stderr = run_cli(
            "compile",
            "schemas/gnn.soa",
            "--model",
            "EdgeClassifier",
            "--factory",
            factory,
            "-o",
            str(tmp_path / "out.pt2"),
            *extra,
        )
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "out.pt2").exists()
    return status, stderr


def test_cli_compile_usage_errors(tmp_path: Path) -> None:
    factory_file = tmp_path / "factory.py"
    factory_file.write_text(TRACK_FACTORY)
    cases = [
        (
            (),
            "examples/missing.py:build_model",
            "factory file 'examples/missing.py' does not exist",
        ),
        ((), "examples/gnn_model.py", "--factory takes FILE.py:FUNCTION"),
        ((), "examples/gnn_model.py:nope", "has no function 'nope'; it defines build_model"),
        ((), f"{factory_file}:not_a_module", "returned int, not a torch.nn.Module"),
        (("--index", "edge_index"), GNN_FACTORY, "--index takes INDEX=BOUND"),
        (("--index", "edge_features=node_features"), GNN_FACTORY, "holds float32, not integer"),
        (("--index", "edges=node_features"), GNN_FACTORY, "has no input 'edges'"),
        (("--device", "nonsense"), GNN_FACTORY, "is not a torch device"),
        (
            ("--columnwise",),
            f"{factory_file}:scripted",
            "--columnwise: columnwise() rewrites Python modules, not TorchScript",
        ),
    ]
    for extra, factory, message in cases:
        status, stderr = _cli_compile(tmp_path, *extra, factory=factory)
        assert status == 2, (factory, stderr)
        assert message in stderr, stderr


def test_a_failing_factory_is_named_with_its_line(tmp_path: Path) -> None:
    raising = tmp_path / "raising.py"
    raising.write_text("import torch\n\n\ndef build():\n    raise ValueError('boom')\n")
    status, stderr = _cli_compile(tmp_path, factory=f"{raising}:build")
    assert status == 1, stderr
    assert f"build() raised ValueError at {raising.as_posix()}:5: boom" in stderr, stderr
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\nx = 1 +\n")
    status, stderr = _cli_compile(tmp_path, factory=f"{broken}:build")
    assert f"importing {broken.as_posix()} failed at {broken.as_posix()}:3: SyntaxError" in stderr
    # A syntax error in a module the factory imports: the factory's importing line.
    (tmp_path / "helper_with_error.py").write_text("\n\n\n\ny = (\n")
    importing = tmp_path / "importing.py"
    importing.write_text("import helper_with_error\n")
    status, stderr = _cli_compile(tmp_path, factory=f"{importing}:build")
    assert f"failed at {importing.as_posix()}:1: SyntaxError" in stderr, stderr
    missing = tmp_path / "missing_import.py"
    missing.write_text("\nimport not_a_module_anywhere\n")
    status, stderr = _cli_compile(tmp_path, factory=f"{missing}:build")
    assert f"failed at {missing.as_posix()}:2: ModuleNotFoundError" in stderr, stderr


def test_cli_compile_unknown_model_lists_the_models(tmp_path: Path) -> None:
    status, _, stderr = run_cli(
        "compile",
        str(GNN_SCHEMA),
        "--model",
        "EdgeClasifier",
        "--factory",
        str(REPO / GNN_FACTORY),
        "-o",
        str(tmp_path / "x.pt2"),
    )
    assert status == 2
    assert "has no model 'EdgeClasifier'; its models are EdgeClassifier" in stderr


def test_cli_compile_output_must_be_pt2(tmp_path: Path) -> None:
    status, _, stderr = run_cli(
        "compile",
        str(GNN_SCHEMA),
        "--model",
        "EdgeClassifier",
        "--factory",
        str(REPO / GNN_FACTORY),
        "-o",
        str(tmp_path / "x.pt"),
    )
    assert status == 2 and "must be a .pt2 file" in stderr


def test_cli_compile_schema_errors_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.soa"
    bad.write_text("layout A {\n    column float33 x\n}\n")
    status, _, stderr = run_cli(
        "compile", str(bad), "--model", "M", "--factory", "f.py:g", "-o", str(tmp_path / "x.pt2")
    )
    assert status == 1 and "SOA101" in stderr


def test_cli_compile_model_that_does_not_fit_exits_1(tmp_path: Path) -> None:
    factory_file = tmp_path / "two_outputs.py"
    factory_file.write_text(
        "import torch\n\n"
        "class Two(torch.nn.Module):\n"
        "    def forward(self, nodes, index, edges):\n"
        "        return edges[:, 0], edges[:, 1]\n\n"
        "def build():\n"
        "    return Two()\n"
    )
    status, stderr = _cli_compile(tmp_path, factory=f"{factory_file}:build")
    assert status == 1
    assert "EdgeClassifier returned 2 output(s), the schema declares 1 (edge_scores)" in stderr


def test_cli_compile_model_returning_a_dict_with_another_key_exits_1(tmp_path: Path) -> None:
    """The outputs are checked as a binding checks them: a dict needs the schema's output names."""
    factory_file = tmp_path / "misnamed.py"
    factory_file.write_text(
        "import torch\n\n"
        "class Misnamed(torch.nn.Module):\n"
        "    def forward(self, nodes, index, edges):\n"
        "        return {'edge_score': edges[:, 0]}\n\n"
        "def build():\n"
        "    return Misnamed()\n"
    )
    status, stderr = _cli_compile(tmp_path, factory=f"{factory_file}:build")
    assert status == 1
    assert (
        "EdgeClassifier returned a dict with keys edge_score; the schema's outputs are edge_scores"
        in stderr
    )


def test_cli_stays_importable_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from soagen.cli import main\n"
        "status = main(['compile', 'schemas/gnn.soa', '--model', 'EdgeClassifier', "
        "'--factory', 'examples/gnn_model.py:build_model', '-o', 'x.pt2'])\n"
        "assert status == 2, status\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "compile needs torch" in done.stderr


def test_compile_help_shows_an_example() -> None:
    status, stdout, _ = run_cli("compile", "--help")
    assert status == 0
    assert "soagen compile schemas/gnn.soa --model EdgeClassifier" in stdout


def test_a_cuda_package_for_another_gpu_generation_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AOTInductor's loader only logs a mismatch; the kernels would then fail with a raw CUDA
    error. The device query is replaced here: CI has no GPU."""
    from soagen.runtime.aot import COMPUTE_CAPABILITY_KEY, check_compute_capability
    from soagen.runtime.errors import ModelLoadError

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 6))
    for runs in ("80", "86", "None"):  # 8.x code on a later 8.x; "None": a CPU build
        check_compute_capability(Path("a.pt2"), {COMPUTE_CAPABILITY_KEY: runs}, 0)
    for refused in ("90", "89", "75"):
        with pytest.raises(
            ModelLoadError,
            match=rf"a.pt2 was compiled for GPUs of compute capability {refused[0]}.{refused[1]}; "
            r"cuda:1 has 8.6",
        ):
            check_compute_capability(Path("a.pt2"), {COMPUTE_CAPABILITY_KEY: refused}, 1)


def test_an_output_that_cannot_be_written_is_refused_before_compiling(tmp_path: Path) -> None:
    (tmp_path / "taken.pt2").mkdir()
    (tmp_path / "file").write_text("")
    for output, message in (
        (tmp_path / "taken.pt2", "a folder of that name exists"),
        (tmp_path / "file" / "x.pt2", "file is a file, not a folder"),
    ):
        with pytest.raises(CompileError, match=message) as caught:
            compile_model(
                REPO / "schemas" / "gnn.soa", "EdgeClassifier", GNN_FACTORY, output=output
            )
        assert caught.value.usage


def test_inputs_declared_contiguous_reach_every_backend_as_row_major_copies(
    tmp_path: Path, gnn_package: Path
) -> None:
    """`contiguous` in the schema: eager and TorchScript get a copy, and `soagen compile` exports
    that input as one, so the package runs on the copies a binding makes (a package compiled
    for the views refuses them, see test_model)."""
    schema = (
        (REPO / "schemas" / "gnn.soa")
        .read_text()
        .replace("as [n, c]\n    output", "as [n, c] contiguous\n    output")
    )
    assert schema.count(" contiguous\n") == 1
    (tmp_path / "gnn_rows.soa").write_text(schema)
    package = compile_model(
        tmp_path / "gnn_rows.soa", "EdgeClassifier", GNN_FACTORY, output=tmp_path / "rows.pt2"
    )
    generate_package(tmp_path / "gnn_rows.soa", tmp_path, "pkg_compile_rows")
    module = import_generated(tmp_path, "pkg_compile_rows", "gnn_rows")
    assert [spec.contiguous for spec in module.EdgeClassifier.INPUTS] == [False, False, True]
    from examples.gnn_model import build_model

    net = build_model()
    seen: list[tuple[bool, bool]] = []

    class Probe(torch.nn.Module):
        def forward(self, nodes: torch.Tensor, index: torch.Tensor, edges: torch.Tensor):  # type: ignore[no-untyped-def]
            seen.append((nodes.is_contiguous(), edges.is_contiguous()))
            return net(nodes, index, edges)

    eager = module.EdgeClassifier(Probe())
    compiled = module.EdgeClassifier.load(package)
    assert compiled.contiguous == {"edge_features"}
    for n_nodes, n_edges in ((7, 1), (40, 90), (301, 1000)):
        nodes, edges = _gnn_inputs(module, n_nodes, n_edges)
        want, got = module.EdgeScores.allocate(n_edges), module.EdgeScores.allocate(n_edges)
        eager(nodes, edges, out=want)
        compiled(nodes, edges, out=got)
        torch.testing.assert_close(got.score, want.score, rtol=1e-4, atol=1e-5)
    assert seen[-1] == (False, True)  # node features stay the column-major view
    with pytest.raises(BindingError, match=r"strided views of 'node_features'"):
        module.EdgeClassifier.load(package, contiguous=["node_features"])
    # A package exported for the views of edge_features does not take the copies.
    with pytest.raises(ModelLoadError, match="edge_features"):
        module.EdgeClassifier.load(gnn_package)


DATA_DEPENDENT = """
import torch


class Branching(torch.nn.Module):
    def forward(self, nodes, index, edges):
        kept = (edges[:, 0] > 0).nonzero()
        if kept.shape[0] > 3:
            return edges[:, 0] * 2
        return edges[:, 0]


def build():
    return Branching()
"""


def test_an_export_error_shows_the_models_line_and_keeps_torchs_text_in_a_log(
    tmp_path: Path,
) -> None:
    factory_file = tmp_path / "branching.py"
    factory_file.write_text(DATA_DEPENDENT)
    status, stderr = _cli_compile(tmp_path, factory=f"{factory_file}:build")
    assert status == 1, stderr
    assert f"at {factory_file}:8 in forward: if kept.shape[0] > 3:" in stderr, stderr
    assert "GuardOnDataDependentSymNode: Could not guard on data-dependent expression" in stderr
    assert "hint: consider using data-dependent friendly APIs" in stderr
    log = tmp_path / "out.compile.log"
    assert f"the full text is in {log.as_posix()}" in stderr
    # torch's partial graph dump and its long guide go to the log, not the terminal.
    assert "def forward" not in stderr and len(stderr.splitlines()) < 16, stderr
    text = log.read_text()
    assert "def forward" in text and "Traceback" in text and "draft_export" in text


NAN_ON_RANDOM_VALUES = """
import torch


class Mass(torch.nn.Module):
    # sqrt(E^2 - p^2): NaN where random normals make |p| > E, as on unphysical four-vectors.
    def forward(self, nodes, index, edges):
        return torch.sqrt(edges[:, 0] ** 2 - edges[:, 1] ** 2)


def build():
    return Mass()


def physical(collections):
    edges = collections["Edges"]
    energy = edges.delta_r
    energy.copy_(torch.rand(energy.shape[0]) + 1.0)
    edges.delta_eta.copy_(energy * torch.rand(energy.shape[0]))


def returns_something(collections):
    return collections


def indices_out_of_range(collections):
    collections["Edges"].src.fill_(collections["Nodes"].size)


def from_a_sibling(collections):
    from mass_helpers import momenta_above_energies

    momenta_above_energies(collections["Edges"])
"""


def test_a_nan_reference_is_named_and_examples_give_realistic_values(tmp_path: Path) -> None:
    factory_file = tmp_path / "mass.py"
    factory_file.write_text(NAN_ON_RANDOM_VALUES)
    status, stderr = _cli_compile(tmp_path, factory=f"{factory_file}:build")
    assert status == 1, stderr
    assert "the eager model itself returns NaN or infinite values on the example inputs" in stderr
    assert "'edge_scores': " in stderr and "--examples FILE.py:FUNCTION" in stderr
    status, stderr = _cli_compile(
        tmp_path, "--examples", f"{factory_file}:returns_something", factory=f"{factory_file}:build"
    )
    assert status == 2 and "returned dict: it must fill the collections" in stderr, stderr
    status, stderr = _cli_compile(
        tmp_path,
        "--examples",
        f"{factory_file}:indices_out_of_range",
        factory=f"{factory_file}:build",
    )
    assert status == 1 and "left input 'edge_index' with indices" in stderr, stderr
    status, stderr = _cli_compile(
        tmp_path, "--examples", f"{factory_file}:absent", factory=f"{factory_file}:build"
    )
    assert status == 2 and "has no function 'absent'" in stderr, stderr
    # A module beside the --examples file is importable when the function runs; the values it
    # writes still give NaN, and the message says whose values those are.
    (tmp_path / "mass_helpers.py").write_text(
        "def momenta_above_energies(edges):\n"
        "    edges.delta_r.fill_(1.0)\n"
        "    edges.delta_eta.fill_(2.0)\n"
    )
    status, stderr = _cli_compile(
        tmp_path, "--examples", f"{factory_file}:from_a_sibling", factory=f"{factory_file}:build"
    )
    assert status == 1, stderr
    assert f"Make the values --examples {factory_file}:from_a_sibling writes realistic" in stderr
    # With realistic values the package is built, and checked at every trial size.
    package = tmp_path / "mass.pt2"
    status, _, stderr = run_cli(
        "compile",
        str(GNN_SCHEMA),
        "--model",
        "EdgeClassifier",
        "--factory",
        f"{factory_file}:build",
        "--examples",
        f"{factory_file}:physical",
        "-o",
        str(package),
    )
    assert status == 0, stderr
    gnn_module = import_generated(REPO, "generated", "gnn")
    nodes, edges = gnn_module.Nodes.allocate(5), gnn_module.Edges.allocate(300, zero=True)
    edges.delta_r.copy_(torch.rand(300) + 1.0)
    edges.delta_eta.copy_(edges.delta_r * torch.rand(300))
    scores = gnn_module.EdgeScores.allocate(300)
    gnn_module.EdgeClassifier.load(package)(nodes, edges, out=scores)
    torch.testing.assert_close(scores.score, torch.sqrt(edges.delta_r**2 - edges.delta_eta**2))


def test_the_package_check_refuses_a_package_that_disagrees(
    gnn: ModuleType, gnn_model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in for a miscompiled package (its scores off by 0.5): the check after compiling
    names the output, the sizes and the difference, so no such package is written."""
    import soagen.build.compile as compile_module
    from soagen.build.model import SchemaOrder, example_sizes, layout_classes

    class OffByHalf:
        writes_outputs = False

        def __init__(self, package: Path, binding: Any) -> None:
            self.model = SchemaOrder(gnn_model, binding)

        def on(self, device: Any) -> Callable[[list[Any]], list[Any]]:
            return lambda inputs: [result + 0.5 for result in self.model(*inputs)]

    monkeypatch.setattr(compile_module, "AotBackend", OffByHalf)
    binding, layouts = gnn.EdgeClassifier, layout_classes(gnn)
    sizes = example_sizes(binding, layouts)
    with pytest.raises(
        CommandError,
        match=r"the compiled package disagrees with the eager model on output 'edge_scores' for "
        r"Nodes n=2049, Edges n=2305: 2305 of 2305 values differ.*largest difference 0\.5",
    ):
        compile_module._verify(
            binding,
            layouts,
            SchemaOrder(gnn_model, binding),
            Path("stand-in.pt2"),
            sizes,
            {"edge_index": "node_features"},
            torch.device("cpu"),
            None,
        )
