"""Backends (eager, TorchScript, torch.compile), index range checks, CPU threads, zero-copy calls."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from soagen.runtime import IndexRangeError, ModelLoadError, OutputError, buffers
from soagen.runtime.backends import file_kind
from soagen.runtime.errors import BindingError
from tests.helpers import REPO, assert_no_host_device_copies

N_NODES, N_EDGES = 300, 1000


@pytest.fixture(scope="module")
def gnn():  # type: ignore[no-untyped-def]
    """The example GNN, its collections filled with valid data, and the eager result."""
    from examples.gnn_model import build_model
    from generated.gnn import Edges, EdgeScores, Nodes

    nodes, edges = Nodes.allocate(N_NODES), Edges.allocate(N_EDGES)
    generator = torch.Generator().manual_seed(3)
    nodes.block("node_features").copy_(torch.randn(N_NODES, 4, generator=generator))
    edges.block("edge_index").copy_(torch.randint(0, N_NODES, (2, N_EDGES), generator=generator))
    edges.block("edge_features").copy_(torch.rand(N_EDGES, 2, generator=generator))
    net = build_model()
    return net, nodes, edges, EdgeScores, _eager(net, nodes, edges)


def _eager(net, nodes, edges):  # type: ignore[no-untyped-def]
    """The model on contiguous copies of the blocks: what every backend must match."""
    with torch.no_grad():
        return net(
            nodes.block("node_features").contiguous(),
            edges.block("edge_index").contiguous(),
            edges.block("edge_features").contiguous(),
        )


def _run(model, gnn):  # type: ignore[no-untyped-def]
    _, nodes, edges, EdgeScores, _ = gnn
    scores = EdgeScores.allocate(N_EDGES)
    model(nodes, edges, out=scores)
    return scores.score


def test_a_planned_aot_call_checks_the_package_geometry_once(gnn, gnn_build) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier, Edges, Nodes

    net, nodes, edges, EdgeScores, _ = gnn
    model = EdgeClassifier.load(gnn_build[0])
    checked = []
    geometry_check = model._backend._check

    def counted(tensors):  # type: ignore[no-untyped-def]
        checked.append(len(tensors))
        geometry_check(tensors)

    model._backend._check = counted  # before the runner is placed, which takes it
    own_nodes, own_edges = Nodes.allocate(N_NODES), Edges.allocate(N_EDGES)
    scores = EdgeScores.allocate(N_EDGES)
    for call in range(5):
        # New values in the same collections: the plan (from the second call) sees them.
        own_nodes.buffer.copy_(nodes.buffer)
        own_edges.buffer.copy_(edges.buffer)
        own_edges.block("edge_features").mul_(1.0 + call)
        model(own_nodes, own_edges, out=scores)
        torch.testing.assert_close(
            scores.score, _eager(net, own_nodes, own_edges), rtol=1e-4, atol=1e-5
        )
    # The first call, unplanned, and the plan's making; none at the three planned calls.
    assert checked == [3, 3]
    # Other collections, no plan: checked at each call.
    model(nodes, edges, out=EdgeScores.allocate(N_EDGES))
    assert checked == [3, 3, 3]


def test_torchscript_module_and_file_match_eager(gnn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier

    net, *_, expected = gnn
    scripted = torch.jit.script(net)
    from_module = EdgeClassifier(scripted)
    assert from_module.backend == "torchscript"
    torch.testing.assert_close(_run(from_module, gnn), expected)
    path = tmp_path / "edge_classifier.pt"
    torch.jit.save(scripted, str(path))
    assert file_kind(path) == "torchscript"
    from_file = EdgeClassifier.load(path)
    assert from_file.backend == "torchscript"
    torch.testing.assert_close(_run(from_file, gnn), expected)


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_eager_and_torchscript_match_contiguous_copies_at_several_sizes(gnn, backend: str) -> None:  # type: ignore[no-untyped-def]
    """Sizes whose pitches differ (n = 1 and 2, n below, at and past a multiple of the alignment's
    element count), a slice (parent pitches, a storage offset), repeated calls (TorchScript's
    profiling executor specializes after its first runs)."""
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    net, nodes, edges, _, _ = gnn
    model = EdgeClassifier(torch.jit.script(net) if backend == "torchscript" else net)
    assert model.backend == backend
    for n_nodes, n_edges in ((1, 1), (2, 2), (1, 5), (31, 32), (32, 33), (50, 77), (300, 1000)):
        small_nodes, small_edges = Nodes.allocate(n_nodes), Edges.allocate(n_edges)
        small_nodes.block("node_features").copy_(nodes.block("node_features")[:n_nodes])
        small_edges.block("edge_index").copy_(edges.block("edge_index")[:, :n_edges] % n_nodes)
        small_edges.block("edge_features").copy_(edges.block("edge_features")[:n_edges])
        for cut in (slice(None), slice(n_edges // 3, None)):  # whole, then a slice of the edges
            part = small_edges[cut]
            for _ in range(3):
                scores = EdgeScores.allocate(part.size, zero=True)
                model(small_nodes, part, out=scores)
                torch.testing.assert_close(scores.score, _eager(net, small_nodes, part))


def test_torch_compile_matches_eager_at_several_sizes(gnn) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    net, nodes, edges, _, expected = gnn
    model = EdgeClassifier(net, backend="compile")
    assert model.backend == "compile"
    torch.testing.assert_close(_run(model, gnn), expected)
    # Another element count (so other pitches and strides) reuses the same compiled model.
    small_nodes, small_edges = Nodes.allocate(50), Edges.allocate(77)
    small_nodes.block("node_features").copy_(nodes.block("node_features")[:50])
    small_edges.block("edge_index").copy_(edges.block("edge_index")[:, :77] % 50)
    small_edges.block("edge_features").copy_(edges.block("edge_features")[:77])
    scores = EdgeScores.allocate(77)
    model(small_nodes, small_edges, out=scores)
    torch.testing.assert_close(scores.score, _eager(net, small_nodes, small_edges))


class _Records(logging.Handler):
    """Every record of one logger, whatever pytest's logging plugin does (or whether it is on)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def clear(self) -> None:
        self.records.clear()


@pytest.fixture
def backend_log() -> Iterator[_Records]:
    """INFO records of soagen.runtime.backends, through a handler of the test's own."""
    logger = logging.getLogger("soagen.runtime.backends")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_first_compile_is_logged_with_the_time_it_took(  # type: ignore[no-untyped-def]
    gnn, backend_log: _Records, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first call of a compiled model waits for torch.compile (18 s for the example GNN on
    # two cores): the log says so before it starts, and how long it took when it is done.
    from generated.gnn import EdgeClassifier

    class QuickScores(nn.Module):  # a model of its own: no graph cached by another test
        def forward(self, x: torch.Tensor, index: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(f[:, 0] - f[:, 1] + x[index[0], 3])

    _, nodes, edges, EdgeScores, _ = gnn
    model = EdgeClassifier(QuickScores(), backend="compile")

    def ours() -> list[logging.LogRecord]:
        return [r for r in backend_log.records if r.name == "soagen.runtime.backends"]

    model(nodes, edges, out=EdgeScores.allocate(N_EDGES))
    start, done = ours()
    assert start.levelno == done.levelno == logging.INFO
    assert start.created <= done.created
    said = start.getMessage()
    assert "EdgeClassifier (QuickScores) on cpu" in said, said
    assert "the first call" in said and "compiles it" in said and "eager model" in said, said
    said = done.getMessage()
    assert re.search(r"EdgeClassifier \(QuickScores\) on cpu finished in \d+\.\d s", said), said
    assert "its outputs agree with the eager model's" in said, said
    backend_log.clear()
    model(nodes, edges, out=EdgeScores.allocate(N_EDGES))  # compiled: nothing to say
    assert not ours()
    assert "torch.compile" not in capsys.readouterr().out  # logged, not printed


def test_torch_compile_traces_a_few_graphs_for_all_size_patterns(gnn, request) -> None:  # type: ignore[no-untyped-def]
    # SoA views meet Dynamo's specializations by chance: a pitch equal to n (n a multiple of the
    # alignment over the itemsize), pitches of two layouts equal, one element. Each compiled a graph
    # of its own, up to torch's recompile limit (8), after which calls ran eagerly.
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch.fx.experimental._config as fx_config
    from torch._dynamo.utils import counters

    # Torch's compile caches do not key on the shape settings: an entry another test compiled for
    # the same graph with torch's defaults brings its guards along (one graph more, none wrong).
    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    request.addfinalizer(stack.close)

    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    class Wrapped(torch.nn.Module):
        # A forward of its own: Dynamo keeps graphs per code object (at most 8), and earlier
        # tests' graphs of the GNN's forward would serve some patterns, or fill that limit.
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, *blocks: torch.Tensor) -> torch.Tensor:
            result: torch.Tensor = self.net(*blocks)
            return result

    net = gnn[0]
    model = EdgeClassifier(Wrapped(net), backend="compile")
    generator = torch.Generator().manual_seed(11)

    def run(n_nodes: int, n_edges: int) -> None:
        nodes, edges = Nodes.allocate(n_nodes), Edges.allocate(n_edges)
        nodes.block("node_features").copy_(torch.randn(n_nodes, 4, generator=generator))
        edges.block("edge_index").copy_(
            torch.randint(0, n_nodes, (2, n_edges), generator=generator)
        )
        edges.block("edge_features").copy_(torch.randn(n_edges, 2, generator=generator))
        scores = EdgeScores.allocate(n_edges)
        model(nodes, edges, out=scores)
        torch.testing.assert_close(
            scores.score, _eager(net, nodes, edges), msg=f"N={n_nodes} E={n_edges}"
        )

    before = counters["stats"]["unique_graphs"]
    # (nodes, edges): generic first, then pitch == n for nodes (32), for int64 edges (16 * odd),
    # for both edge dtypes (64), pitches of two layouts equal (32, 32), one and two elements.
    for n_nodes, n_edges in [(37, 129), (32, 100), (50, 48), (37, 64), (32, 32), (1, 1), (2, 2)]:
        run(n_nodes, n_edges)
    # At most three: the generic graph; one where the edge index's rows are contiguous (pitch ==
    # n), which the model's scatter checks; one for a single element (see
    # `_install_general_shapes`).
    first_round = counters["stats"]["unique_graphs"] - before
    assert first_round <= 3, model.compiled_graphs
    assert sum(graph.graphs for graph in model.compiled_graphs) <= 3
    # The same patterns at other sizes reuse them.
    for n_nodes, n_edges in [(41, 131), (64, 200), (70, 80), (45, 192), (64, 64), (1, 1), (3, 3)]:
        run(n_nodes, n_edges)
    assert counters["stats"]["unique_graphs"] - before == first_round, model.compiled_graphs
    # The settings hold only during soagen's compiles; a user's own torch.compile sees torch's.
    assert fx_config.use_duck_shape and not fx_config.backed_size_oblivious


def test_shape_settings_come_back_when_another_thread_ends_the_compile_window(gnn) -> None:  # type: ignore[no-untyped-def]
    # Dynamo runs its end callback when the last compile in flight, in any thread, ends: here a
    # lazy-backward window opened in another thread during soagen's compile outlives it.
    import threading

    import torch.fx.experimental._config as fx_config
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    compiling, done = threading.Event(), threading.Event()
    signal = callback_handler.register_start_callback(lambda _: compiling.set())

    def other_thread() -> None:
        compiling.wait(timeout=60)
        with callback_handler.install_callbacks(CallbackTrigger.LAZY_BACKWARD, "other"):
            done.wait(timeout=60)

    worker = threading.Thread(target=other_thread)
    worker.start()
    try:
        nodes, edges = Nodes.allocate(41), Edges.allocate(131)
        edges.block("edge_index").copy_(torch.randint(0, 41, (2, 131)))
        # A module of its own class: Dynamo compiles its forward afresh.
        net = type("Fresh", (type(gnn[0]),), {})()
        EdgeClassifier(net, backend="compile")(nodes, edges, out=EdgeScores.allocate(131))
    finally:
        done.set()
        worker.join()
        callback_handler.remove_start_callback(signal)
    assert compiling.is_set()  # the window did overlap a compile
    assert fx_config.use_duck_shape and not fx_config.backed_size_oblivious


def _wrong_by_one(graph: torch.fx.GraphModule, _: object) -> object:
    """A torch.compile backend that miscompiles: every floating result is off by one."""

    def run(*arguments: object) -> object:
        results = graph(*arguments)
        return type(results)(
            r + 1 if isinstance(r, torch.Tensor) and r.is_floating_point() else r for r in results
        )

    return run


def test_a_compiled_graph_that_disagrees_with_eager_is_refused(gnn) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier
    from soagen.runtime import CompiledModelMismatchError
    from soagen.runtime.backends import CompileBackend

    net, nodes, edges, EdgeScores, _ = gnn
    backend = CompileBackend(
        type("Miscompiled", (type(net),), {})(), {"backend": _wrong_by_one}, binding=EdgeClassifier
    )
    backend.module.load_state_dict(net.state_dict())
    model = EdgeClassifier(backend)
    scores = EdgeScores.allocate(N_EDGES, zero=True)
    with pytest.raises(
        CompiledModelMismatchError,
        match=rf"output 'edge_scores' at node_features n={N_NODES}, edge_index n={N_EDGES}, "
        rf"edge_features n={N_EDGES}: {N_EDGES} of {N_EDGES} values differ.*largest difference 1",
    ):
        model(nodes, edges, out=scores)
    assert not scores.score.any()  # nothing written
    (graph,) = model.compiled_graphs
    assert graph.graphs >= 1 and graph.inputs[0][:2] == ("node_features", (N_NODES, 4))
    assert f"{graph.graphs} graph(s) compiled" in repr(model)
    # The graph stays in torch's cache: later calls, after close() too, would reuse it unchecked.
    for _ in range(2):
        with pytest.raises(CompiledModelMismatchError, match="later calls there are refused"):
            model(nodes, edges, out=scores)
        model.close()
    assert not scores.score.any()
    # Another binding of the same class finds the cached graph: its first call is checked too.
    again = CompileBackend(
        type(backend.module)(), {"backend": _wrong_by_one}, binding=EdgeClassifier
    )
    again.module.load_state_dict(net.state_dict())
    with pytest.raises(CompiledModelMismatchError, match="values differ"):
        EdgeClassifier(again)(nodes, edges, out=scores)
    assert not scores.score.any()


# Runs of every graph `_wrong_the_first_time` made, across graphs.
_RUNS: list[int] = []


def _wrong_the_first_time(graph: torch.fx.GraphModule, _: object) -> object:
    """A backend whose graphs are off by one on the first run of any of them only: as a
    miscompiled graph that a second run no longer reaches (Dynamo past its recompile limit runs
    the frame eagerly)."""

    def run(*arguments: object) -> object:
        results = graph(*arguments)
        _RUNS.append(1)
        if len(_RUNS) > 1:
            return results
        return type(results)(
            r + 1 if isinstance(r, torch.Tensor) and r.is_floating_point() else r for r in results
        )

    return run


def test_a_disagreement_is_never_explained_away_by_running_the_compiled_model_again(gnn) -> None:  # type: ignore[no-untyped-def]
    """Telling a model that writes its inputs from a miscompile reads the inputs' bytes around
    the eager run; it never calls the compiled model again, which may not run the same graph."""
    from generated.gnn import EdgeClassifier
    from soagen.runtime import CompiledModelMismatchError
    from soagen.runtime.backends import CompileBackend

    net = gnn[0]
    _RUNS.clear()
    backend = CompileBackend(
        type("WrongOnce", (type(net),), {})(),
        {"backend": _wrong_the_first_time},
        binding=EdgeClassifier,
    )
    backend.module.load_state_dict(net.state_dict())
    model = EdgeClassifier(backend)
    with pytest.raises(CompiledModelMismatchError, match="edge_scores"):
        _run(model, gnn)


def test_shape_settings_survive_a_dynamo_reset(gnn) -> None:  # type: ignore[no-untyped-def]
    # torch._dynamo.reset() drops every compile callback, soagen's included: a compile after it
    # traced with duck shaping on, so every pitch equal to n compiled a graph of its own.
    import torch.fx.experimental._config as fx_config

    from generated.gnn import EdgeClassifier
    from soagen.runtime.backends import CompileBackend

    seen: list[bool] = []

    def recorder(graph: torch.fx.GraphModule, example_inputs: object) -> object:
        seen.append(fx_config.use_duck_shape)
        return graph.forward

    net, _, _, _, expected = gnn
    backend = CompileBackend(
        type("AfterReset", (type(net),), {})(), {"backend": recorder}, binding=EdgeClassifier
    )
    backend.module.load_state_dict(net.state_dict())
    model = EdgeClassifier(backend)
    torch.testing.assert_close(_run(model, gnn), expected)
    torch._dynamo.reset()
    torch.testing.assert_close(_run(model, gnn), expected)  # compiles again, after the reset
    assert seen == [False, False]
    assert fx_config.use_duck_shape


def test_fallback_to_eager_warns_once_and_runs_eagerly(gnn) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier
    from soagen.runtime.backends import CompileBackend

    net, nodes, edges, EdgeScores, expected = gnn
    backend = CompileBackend(
        type("Miscompiled2", (type(net),), {})(),
        {"backend": _wrong_by_one},
        binding=EdgeClassifier,
        fallback_to_eager=True,
    )
    backend.module.load_state_dict(net.state_dict())
    model = EdgeClassifier(backend)
    with pytest.warns(
        RuntimeWarning, match="disagrees with the eager model.*running eagerly on cpu"
    ):
        torch.testing.assert_close(_run(model, gnn), expected)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(_run(model, gnn), expected)  # eager from now on, no warning
        model.close()  # and after close(), which drops the runner, not what was found
        torch.testing.assert_close(_run(model, gnn), expected)


def test_a_right_compile_is_checked_once_per_graph(gnn, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier
    from soagen.runtime import backends

    checks = []
    original = backends.CompileBackend._check
    monkeypatch.setattr(
        backends.CompileBackend,
        "_check",
        lambda self, *args: (checks.append(1), original(self, *args))[1],
    )
    net = type("CheckedOnce", (type(gnn[0]),), {})()
    net.load_state_dict(gnn[0].state_dict())
    model = EdgeClassifier(net, backend="compile")
    for _ in range(3):
        torch.testing.assert_close(_run(model, gnn), gnn[4])
    # Once: the first call (its graph compiled now, or found in torch's cache from an earlier
    # test, which the first call of every runner is checked against too).
    assert len(checks) == 1 and len(model.compiled_graphs) <= 1


class DoublesItsEdges(nn.Module):
    def forward(
        self, nodes: torch.Tensor, index: torch.Tensor, edges: torch.Tensor
    ) -> torch.Tensor:
        edges.mul_(2)
        return edges[:, 0] + 1  # a tensor of its own, not a view of the input


def test_a_compiled_model_that_writes_its_inputs_is_reported_as_such(gnn) -> None:  # type: ignore[no-untyped-def]
    """The check's eager run reads inputs the compiled run already wrote, so the two differ; a
    rerun of both on copies tells that from a miscompile, and the binding reports the write."""
    from generated.gnn import EdgeClassifier
    from soagen.runtime import InputModifiedError

    _, nodes, edges, EdgeScores, _ = gnn
    copy = type(edges).allocate(edges.size)
    copy.buffer.copy_(edges.buffer)
    model = EdgeClassifier(DoublesItsEdges(), backend="compile")
    with pytest.raises(InputModifiedError, match="wrote into its input 'edge_features'"):
        model(nodes, copy, out=EdgeScores.allocate(N_EDGES))


def test_fallback_to_eager_is_for_the_compile_backend(gnn) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier

    with pytest.raises(ModelLoadError, match="fallback_to_eager is for backend='compile'"):
        EdgeClassifier(gnn[0], fallback_to_eager=True)


class EndpointScorer(nn.Module):
    """Scores each edge from its two end nodes and its own features: an edge's score depends on
    no other edge, so slicing the edges changes nothing. Records the shapes of each call."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.score = nn.Linear(4 + 4 + 2, 1)
        self.shapes: list[tuple[int, int, int]] = []

    def forward(
        self, nodes: torch.Tensor, index: torch.Tensor, edges: torch.Tensor
    ) -> torch.Tensor:
        self.shapes.append((nodes.shape[0], index.shape[1], edges.shape[0]))
        ends = torch.cat([nodes.index_select(0, index[0]), nodes.index_select(0, index[1])], 1)
        return torch.sigmoid(self.score(torch.cat([ends, edges], 1))).squeeze(1)


def test_batch_size_passes_whole_inputs_entire_to_every_slice(gnn) -> None:  # type: ignore[no-untyped-def]
    """As CMSSW's BatchedTensorCollection passes some collections whole: the schema declares
    `node_features` whole, so batch_size slices the edges and the scores and hands every slice all
    nodes, which `edge_index` numbers."""
    from generated.gnn import EdgeClassifier

    _, nodes, edges, EdgeScores, _ = gnn
    scorer = EndpointScorer()
    whole, batched = EdgeScores.allocate(N_EDGES), EdgeScores.allocate(N_EDGES, zero=True)
    EdgeClassifier(scorer)(nodes, edges, out=whole)
    scorer.shapes.clear()
    EdgeClassifier(scorer)(nodes, edges, out=batched, batch_size=100)
    torch.testing.assert_close(batched.score, whole.score, rtol=0, atol=0)
    # Slices start aligned: 100 rounds up to 128 elements (align 128 over 4-byte floats).
    assert scorer.shapes == [(N_NODES, 128, 128)] * 7 + [(N_NODES, 104, 104)]


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_the_example_gnn_runs_with_batch_size(gnn, backend: str) -> None:  # type: ignore[no-untyped-def]
    """The example GNN sums each node's messages over the edges it is given: a slice sees its own
    edges only, so its scores are those of the model run on that slice with every node."""
    from generated.gnn import EdgeClassifier

    net, nodes, edges, EdgeScores, _ = gnn
    model = EdgeClassifier(torch.jit.script(net) if backend == "torchscript" else net)
    scores = EdgeScores.allocate(N_EDGES, zero=True)
    model(nodes, edges, out=scores, batch_size=500)
    features, index, edge_features = (
        nodes.block("node_features"),
        edges.block("edge_index"),
        edges.block("edge_features"),
    )
    with torch.no_grad():
        expected = torch.cat(
            [
                net(
                    features.contiguous(),
                    index[:, a:b].contiguous(),
                    edge_features[a:b].contiguous(),
                )
                for a, b in ((0, 512), (512, N_EDGES))
            ]
        )
    torch.testing.assert_close(scores.score, expected)


class WithDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.5)

    def forward(
        self, nodes: torch.Tensor, index: torch.Tensor, features: torch.Tensor
    ) -> torch.Tensor:
        return self.dropout(features[:, 0] + 1)


@pytest.mark.parametrize("backend", ["eager", "compile"])
def test_modules_run_in_eval_mode(gnn, backend: str) -> None:  # type: ignore[no-untyped-def]
    """A module bound in training mode is put in eval mode, as TorchScript files are run and
    `soagen compile` exports: its dropout would make each call's results differ. Put back in
    training mode later (a loop that trains and validates), it is refused until .eval()."""
    from generated.gnn import EdgeClassifier

    _, nodes, edges, _, _ = gnn
    net = WithDropout()
    assert net.training
    model = EdgeClassifier(net, backend=backend)
    assert not net.training
    expected = edges.delta_r + 1
    torch.testing.assert_close(_run(model, gnn), expected)
    torch.testing.assert_close(_run(model, gnn), expected)
    net.train()
    with pytest.raises(ModelLoadError, match="WithDropout is in training mode .*call .eval"):
        _run(model, gnn)
    net.eval()
    torch.testing.assert_close(_run(model, gnn), expected)


def test_runner_is_built_once_per_device(gnn) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier

    net, *_ = gnn
    model = EdgeClassifier(net)
    _run(model, gnn)
    _run(model, gnn)
    backend = model._backend
    assert backend.devices == (torch.device("cpu"),)
    assert backend.on(torch.device("cpu")) is backend.on(torch.device("cpu"))


def test_eager_call_copies_only_the_outputs(gnn) -> None:  # type: ignore[no-untyped-def]
    """The inputs reach the model as views: the only copy in a call is the output write-back."""
    from generated.gnn import EdgeClassifier

    class Sums(nn.Module):
        def forward(self, nodes: torch.Tensor, index: torch.Tensor, edges: torch.Tensor):  # type: ignore[no-untyped-def]
            return torch.where(index[0] >= 0, edges.sum(1), nodes.sum())

    # Without the schema's index check, which reduces a padded [2, n] index block through one
    # scratch copy of that block (`torch.aminmax` flattens it: faster than two strided passes).
    model = EdgeClassifier(Sums(), index_bounds={"edge_index": None})
    assert model.index_bounds == {}
    _run(model, gnn)  # placement and thread set-up happen outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        _run(model, gnn)
    names = [event.name for event in profile.events()]
    assert names.count("aten::copy_") == 1  # the one output block
    # Collections called with again: their call plan writes the block through the compiled
    # loop where the install built it (no ATen op), else through copy_.
    _, nodes, edges, EdgeScores, _ = gnn
    scores = EdgeScores.allocate(N_EDGES)
    model(nodes, edges, out=scores)
    model(nodes, edges, out=scores)  # makes their plan
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as planned:
        model(nodes, edges, out=scores)
    planned_names = [event.name for event in planned.events()]
    assert planned_names.count("aten::copy_") == (0 if buffers._BlockWriter is not None else 1)
    for forbidden in (
        "aten::clone",
        "aten::contiguous",
        "aten::to",
        "aten::_to_copy",
        "aten::stack",
    ):
        assert forbidden not in names and forbidden not in planned_names


@pytest.mark.parametrize(
    "returned, message",
    [
        (lambda s: {"edge_scores": s}, None),
        (lambda s: (s,), None),
        (lambda s: [s], None),
        (lambda s: {"scores": s}, "dict with keys scores; the schema's outputs are edge_scores"),
        (lambda s: None, "returned NoneType"),
        (lambda s: (s, 3), "returned tuple"),
    ],
)
def test_output_forms(gnn, returned, message: str | None) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier

    net, nodes, edges, EdgeScores, expected = gnn

    class Wrapped(nn.Module):
        def forward(self, *inputs: torch.Tensor):  # type: ignore[no-untyped-def]
            return returned(net(*inputs))

    scores = EdgeScores.allocate(N_EDGES)
    scores.score.fill_(5)
    if message is None:
        EdgeClassifier(Wrapped())(nodes, edges, out=scores)
        torch.testing.assert_close(scores.score, expected)
    else:
        with pytest.raises(OutputError, match=message):
            EdgeClassifier(Wrapped())(nodes, edges, out=scores)
        assert bool((scores.score == 5).all())


@pytest.mark.parametrize("bad_value", [N_NODES, -1, 10**12])
def test_index_out_of_range_stops_the_call(gnn, bad_value: int) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier

    calls: list[int] = []

    class Counting(nn.Module):
        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return inputs[2][:, 0]

    _, nodes, edges, EdgeScores, _ = gnn
    model = EdgeClassifier(Counting(), index_bounds={"edge_index": "node_features"})
    scores = EdgeScores.allocate(N_EDGES)
    model(nodes, edges, out=scores)
    assert calls == [1]
    bad = edges.clone()
    bad.dst[17] = bad_value
    with pytest.raises(IndexRangeError, match=r"'edge_index' holds indices outside \[0, 300\)"):
        model(nodes, bad, out=scores)
    assert calls == [1]


def test_the_schemas_index_bound_is_checked_unless_turned_off() -> None:
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    nodes, edges = Nodes.allocate(30, zero=True), Edges.allocate(50, zero=True)
    edges.dst[7] = -1  # Inductor's kernels and `x[index]` would read the last node unnoticed
    scores = EdgeScores.allocate(50)
    checked = EdgeClassifier(build_model())  # `indexes node_features` in schemas/gnn.soa
    assert checked.index_bounds == {"edge_index": "node_features"}
    with pytest.raises(IndexRangeError, match=r"outside \[0, 30\).*\(values -1\.\.0\)"):
        checked(nodes, edges, out=scores)
    unchecked = EdgeClassifier(build_model(), index_bounds={"edge_index": None})
    assert unchecked.index_bounds == {}
    with pytest.raises(IndexError, match="index out of range"):
        unchecked(nodes, edges, out=scores)  # no check: the model's own `index_select` raises
    with pytest.raises(BindingError, match="has no input 'edges'"):
        EdgeClassifier(build_model(), index_bounds={"edges": None})


def test_index_bounds_are_validated() -> None:
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier

    with pytest.raises(BindingError, match="has no input 'nodes'"):
        EdgeClassifier(build_model(), index_bounds={"edge_index": "nodes"})
    with pytest.raises(BindingError, match="holds float32, not integer indices"):
        EdgeClassifier(build_model(), index_bounds={"edge_features": "node_features"})


def test_model_files_are_recognised_by_content(tmp_path: Path) -> None:
    from generated.gnn import EdgeClassifier

    pickled = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, pickled)
    with pytest.raises(ModelLoadError, match="pickled object"):
        EdgeClassifier.load(pickled)
    garbage = tmp_path / "model.pt2"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(ModelLoadError, match="is not a TorchScript .* or AOTInductor"):
        EdgeClassifier.load(garbage)
    with pytest.raises(ModelLoadError, match="does not exist"):
        EdgeClassifier.load(tmp_path / "missing.pt")
    scripted = tmp_path / "scripted.pt2"  # a misleading suffix changes nothing
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(scripted))
    with pytest.raises(
        ModelLoadError, match=r"is a TorchScript file \(.pt\); it cannot run with backend=.aot."
    ):
        EdgeClassifier.load(scripted, backend="aot")


def test_backend_choice_errors() -> None:
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier

    with pytest.raises(
        ModelLoadError, match="one of eager, torchscript, compile, aot, onnxruntime; got 'fast'"
    ):
        EdgeClassifier(build_model(), backend="fast")
    with pytest.raises(ModelLoadError, match="backend='aot' needs a model file.*soagen compile"):
        EdgeClassifier(build_model(), backend="aot")
    with pytest.raises(ModelLoadError, match="runs with backend='torchscript', not 'compile'"):
        EdgeClassifier(torch.jit.script(build_model()), backend="compile")
    with pytest.raises(ModelLoadError, match="got int"):
        EdgeClassifier(3)


THREADS_PROGRAM = textwrap.dedent(
    """
    import torch
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes
    torch.set_num_threads(2)
    EdgeClassifier(build_model())(Nodes.allocate(4), Edges.allocate(0), out=EdgeScores.allocate(0))
    print(torch.get_num_threads(), torch.get_num_interop_threads())
    """
)


@pytest.mark.parametrize(
    "setting, omp, expected",
    [
        (None, None, "1 1"),
        ("2", None, "2 1"),
        ("2,2", None, "2 2"),
        ("many", None, "SOAGEN_CPU_THREADS='many'"),
        ("0", None, "SOAGEN_CPU_THREADS='0': expected a positive thread count"),
        ("2,0", None, "SOAGEN_CPU_THREADS='2,0'"),
        ("+3", None, "SOAGEN_CPU_THREADS='+3'"),
        # torch's own variable chose the intra-op count (the program then sets 2): it stays.
        (None, "3", "2 1"),
        ("1", "3", "1 1"),  # soagen's variable decides
    ],
)
def test_cpu_threads_are_set_at_the_first_cpu_call(
    setting: str | None, omp: str | None, expected: str
) -> None:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("SOAGEN_CPU_THREADS", "OMP_NUM_THREADS")
    }
    if setting is not None:
        environment["SOAGEN_CPU_THREADS"] = setting
    if omp is not None:
        environment["OMP_NUM_THREADS"] = omp
    result = subprocess.run(
        [sys.executable, "-c", THREADS_PROGRAM],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if expected.startswith("SOAGEN_CPU_THREADS="):  # refused: the program stops with the error
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stdout == "" and expected in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"{expected}\n"


def test_example_runs_every_backend(
    capsys: pytest.CaptureFixture[str], gnn_build: tuple[Path, str, str]
) -> None:
    """The README's main command, at a small size: one row per backend, each checked."""
    from examples.run_gnn import main

    arguments = ["--nodes", "40", "--edges", "90", "--repeat", "1"]
    assert main([*arguments, "--package", str(gnn_build[0])]) == 0
    output = capsys.readouterr().out
    for backend in ("eager", "torchscript", "compile", "aot"):
        assert f"| soagen {backend} |" in output, output
    assert "every backend's scores match" in output
    with pytest.raises(SystemExit, match="needs --package"):
        main([*arguments, "--backend", "aot"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_runs_where_the_data_lives_on_the_given_stream(gnn) -> None:  # type: ignore[no-untyped-def]
    from generated.gnn import EdgeClassifier

    net, nodes, edges, EdgeScores, expected = gnn
    model = EdgeClassifier(net, index_bounds={"edge_index": "node_features"})
    cpu_scores = EdgeScores.allocate(N_EDGES)
    model(nodes, edges, out=cpu_scores)
    gpu_nodes, gpu_edges = nodes.to("cuda"), edges.to("cuda")
    gpu_scores = EdgeScores.allocate(N_EDGES, device="cuda")
    model(gpu_nodes, gpu_edges, out=gpu_scores)  # places the model: its weights go to the GPU once
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the last call wrote gpu_scores there
    assert_no_host_device_copies(
        lambda: model(gpu_nodes, gpu_edges, out=gpu_scores, stream=stream), stream
    )
    # One model object now serves both devices; the CPU module stays where it was.
    assert set(model._backend.devices) == {torch.device("cpu"), gpu_nodes.device}
    assert next(net.parameters()).device.type == "cpu"
    torch.testing.assert_close(gpu_scores.score.cpu(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cpu_scores.score, expected)


KEPT_PROGRAM = textwrap.dedent(
    """
    import os, sys, threading, torch
    from soagen.runtime import set_malloc_tuning
    print("tuned" if set_malloc_tuning(sys.argv[1] == "on") else "untuned")
    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    def kept() -> int:
        before = resident()
        block = torch.ones(32_000_000)  # 128 MB: above glibc's mmap threshold and thread heaps
        del block
        return resident() - before
    if sys.argv[2] == "thread":
        found = []
        worker = threading.Thread(target=lambda: found.append(kept()))
        worker.start()
        worker.join()
        print(found[0])
    else:
        print(kept())
    """
)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="malloc tuning is for glibc",
)
def test_malloc_tuning_keeps_freed_memory_mapped() -> None:
    """Untuned, glibc unmaps a freed 128 MB block at once, and the next call faults it in anew;
    tuned, the block stays in the heap (resident) for the next call, in the main thread and in
    others (whose own arenas could not hold it)."""
    # glibc's own settings from the environment (MALLOC_*, GLIBC_TUNABLES) would move both.
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "SOAGEN_MALLOC_TUNING")
    }
    kept = {}
    for setting in ("on", "off"):
        for where in ("main", "thread"):  # one process each: nothing resident from the other
            result = subprocess.run(
                [sys.executable, "-c", KEPT_PROGRAM, setting, where],
                env=environment,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            state, grown = result.stdout.split()
            assert state == ("tuned" if setting == "on" else "untuned")
            kept[setting, where] = int(grown)
    assert min(kept["on", "main"], kept["on", "thread"]) >= 120_000_000, kept
    assert max(kept["off", "main"], kept["off", "thread"]) <= 8_000_000, kept


@pytest.mark.parametrize(("system", "libc"), [("Linux", "musl"), ("Linux", ""), ("Darwin", "")])
def test_malloc_tuning_is_never_applied_outside_glibc(
    monkeypatch: pytest.MonkeyPatch, system: str, libc: str
) -> None:
    """mallopt's parameter numbers are glibc's: another C library must not be handed them."""
    import ctypes
    import platform

    from soagen.runtime import cpu

    loaded: list[str] = []
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "libc_ver", lambda *_, **__: (libc, ""))
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *_, **__: loaded.append(name))
    monkeypatch.setattr(cpu, "_malloc_decided", False)
    assert cpu.set_malloc_tuning(True) is False
    cpu.ensure_malloc_tuning()  # decided: nothing more
    assert loaded == []
