"""CUDA graphs of model calls (`graphs=True`, `soagen.runtime.graphs`).

On CPU the binding's graph logic runs against test doubles of the capturer: a "graph" there is the
captured call itself, run again at each replay, so what is tested is soagen's side (keys, the bound,
the checks before and after a capture, the refusals), with real models and collections. The tests
marked `cuda` run the CUDA capturer itself and skip cleanly without a GPU: run them on one with
`pytest tests/runtime/test_graphs.py`.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from examples.gnn_model import build_model  # noqa: E402
from soagen.runtime.aligned import aligned_tensor  # noqa: E402
from soagen.runtime.errors import (  # noqa: E402
    BindingError,
    GraphCaptureError,
    GraphMismatchError,
    IndexRangeError,
    InputModifiedError,
    ModelLoadError,
)
from soagen.runtime.graphs import (  # noqa: E402
    OUT_OF_MEMORY_REFUSAL,
    STREAMS_KEPT,
    WARM_UP_CALLS,
    CallGraphs,
    cuda_capturer,
)
from tests.helpers import REPO, assert_no_host_device_copies  # noqa: E402

_T = TypeVar("_T")

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


# --- test doubles of the capturer ----------------------------------------------------------------


class Rerun:
    """A captured call on CPU: replaying runs it again."""

    def __init__(self, run: Callable[[], object], capturer: RerunCapturer) -> None:
        self._run, self._capturer = run, capturer

    def replay(self) -> None:
        self._capturer.replays += 1
        self._run()


class RerunCapturer:
    """Captures on CPU. As a CUDA capture runs no kernel, capturing runs nothing: the call runs
    at each replay. Counts what it did and keeps a weak reference to each graph it made."""

    device_type = "cpu"

    def __init__(self) -> None:
        self.current_stream: Hashable = 0
        self.capturing_now = False  # whether the caller's stream is being captured
        self.warm_ups = self.captures = self.replays = 0
        self.graphs: list[weakref.ref[Rerun]] = []

    def stream(self, device: Any) -> Hashable:
        return self.current_stream

    def capturing(self, device: Any) -> bool:
        return self.capturing_now

    def warm_up(self, device: Any, stream: Hashable, run: Callable[[], _T]) -> _T:
        self.warm_ups += 1
        return run()

    def capture(self, device: Any, stream: Hashable, run: Callable[[], object]) -> Rerun:
        self.captures += 1
        graph = self.graph(run)
        self.graphs.append(weakref.ref(graph))
        return graph

    def graph(self, run: Callable[[], object]) -> Rerun:
        return Rerun(run, self)

    def alive(self) -> list[bool]:
        return [ref() is not None for ref in self.graphs]


class WrongReplays(RerunCapturer):
    """Its graphs replay the call, then `corrupt()`: what a graph that read stale memory gives."""

    def __init__(self, corrupt: Callable[[], object]) -> None:
        super().__init__()
        self.corrupt = corrupt

    def graph(self, run: Callable[[], object]) -> Rerun:
        def wrong() -> None:
            run()
            self.corrupt()

        return Rerun(wrong, self)


class NoHostReads(TorchFunctionMode):
    """Refuses reading a tensor's values on the host, as CUDA refuses the wait for the device it
    takes while a stream is captured, with CUDA's message."""

    reads = frozenset(("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__"))

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", None) in self.reads:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return func(*args, **(kwargs or {}))


class RunsThePythonAtCapture(RerunCapturer):
    """As a CUDA capture does, runs the call's Python when capturing, reads of device values on
    the host refused. (On CPU its ops run too: used where the call fails before writing.)"""

    def capture(self, device: Any, stream: Hashable, run: Callable[[], object]) -> Rerun:
        with NoHostReads():
            run()
        return super().capture(device, stream, run)


def graphed(binding: type[Any], model: object, capturer: Any, cache_size: int = 8, **options: Any):  # type: ignore[no-untyped-def]
    """A binding made with graphs=True whose graphs are captured by `capturer`."""
    made = binding(model, graphs=True, **options)
    made._graphs = CallGraphs(made, capturer, cache_size)
    return made


# --- models and collections ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gnn() -> ModuleType:
    import generated.gnn

    return generated.gnn


@pytest.fixture(scope="module")
def mlp(generated_from_text: Callable[[str], ModuleType]) -> ModuleType:
    return generated_from_text((REPO / "benchmarks" / "schemas" / "mlp.soa").read_text())


@pytest.fixture(scope="module")
def net() -> nn.Module:
    return build_model()


def event(gnn: ModuleType, n_nodes: int, n_edges: int, seed: int, device: str = "cpu") -> Any:
    """Nodes and edges with random features and indices in range."""
    generator = torch.Generator().manual_seed(seed)
    nodes = gnn.Nodes.allocate(n_nodes, device=device, zero=True)
    edges = gnn.Edges.allocate(n_edges, device=device, zero=True)
    nodes.block("node_features").copy_(torch.randn(n_nodes, 4, generator=generator))
    edges.block("edge_index").copy_(torch.randint(0, n_nodes, (2, n_edges), generator=generator))
    edges.block("edge_features").copy_(torch.randn(n_edges, 2, generator=generator))
    return nodes, edges


def eager_scores(gnn: ModuleType, net: nn.Module, nodes: Any, edges: Any) -> Any:
    """What a plain binding writes for these collections."""
    scores = gnn.EdgeScores.allocate(edges.size, device=edges.device)
    gnn.EdgeClassifier(net)(nodes, edges, out=scores)
    return scores.score.clone()


def hits(mlp: ModuleType, n: int, seed: int, device: str = "cpu") -> Any:
    made = mlp.Hits.allocate(n, device=device)
    generator = torch.Generator().manual_seed(seed)
    made.block("features").copy_(torch.randn(n, 4, generator=generator))
    return made


class CountsCalls:
    """Counts a module's forward calls (a forward pre-hook)."""

    def __init__(self, module: nn.Module) -> None:
        self.count = 0
        module.register_forward_pre_hook(self._called)

    def _called(self, module: nn.Module, inputs: object) -> None:
        self.count += 1


class WaitsForTheDevice(nn.Module):
    """Reads a device value on the host inside its call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        largest = features.abs().max().item()
        result: torch.Tensor = self.linear(features) / (1.0 + largest)
        return result


class WritesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        features.mul_(2.0)
        result: torch.Tensor = self.linear(features)
        return result


# --- CPU: soagen's side of graphs, against the doubles -------------------------------------------


def test_later_calls_on_the_same_memory_replay_the_graph(gnn: ModuleType, net: nn.Module) -> None:
    capturer = RerunCapturer()
    model = graphed(gnn.EdgeClassifier, net, capturer)
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    model(nodes, edges, out=scores)
    # Warmed up (eager runs), captured, replayed once to be compared.
    assert (capturer.warm_ups, capturer.captures, capturer.replays) == (1, 1, 1)
    assert torch.equal(scores.score, eager_scores(gnn, net, nodes, edges))
    # New values in the same buffers: the same key. Its second call runs eagerly once more and
    # compares its replay with that (`_confirm`); later ones only replay.
    for seed, counts in ((2, (2, 1, 2)), (3, (2, 1, 3)), (4, (2, 1, 4))):
        fresh_nodes, fresh_edges = event(gnn, 30, 100, seed=seed)
        nodes.buffer.copy_(fresh_nodes.buffer)
        edges.buffer.copy_(fresh_edges.buffer)
        model(nodes, edges, out=scores)
        assert torch.equal(scores.score, eager_scores(gnn, net, nodes, edges))
        assert (capturer.warm_ups, capturer.captures, capturer.replays) == counts
    assert len(model._graphs) == 1


def test_each_buffer_size_slice_and_stream_is_a_key_of_its_own(
    gnn: ModuleType, net: nn.Module
) -> None:
    capturer = RerunCapturer()
    model = graphed(gnn.EdgeClassifier, net, capturer, cache_size=16)
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    model(nodes, edges, out=scores)
    other_nodes, other_edges = event(gnn, 30, 100, seed=2)  # other buffers, same sizes
    other_scores = gnn.EdgeScores.allocate(100)
    bigger_nodes, bigger_edges = event(gnn, 31, 101, seed=3)
    bigger_scores = gnn.EdgeScores.allocate(101)
    part, part_scores = edges.slice(32, 96), gnn.EdgeScores.allocate(64)
    calls = [
        (nodes, edges, other_scores),
        (other_nodes, edges, scores),
        (nodes, other_edges, scores),
        (bigger_nodes, bigger_edges, bigger_scores),
        (nodes, part, part_scores),
    ]
    for count, (call_nodes, call_edges, out) in enumerate(calls, start=2):
        model(call_nodes, call_edges, out=out)
        assert capturer.captures == count
        assert torch.equal(out.score, eager_scores(gnn, net, call_nodes, call_edges))
    capturer.current_stream = 1
    model(nodes, edges, out=scores)
    assert capturer.captures == 7
    capturer.current_stream = 0
    replays = capturer.replays
    for call_nodes, call_edges, out in calls:  # each replayed, none captured again
        model(call_nodes, call_edges, out=out)
    assert (capturer.captures, capturer.replays) == (7, replays + len(calls))


@pytest.fixture(params=["compiled replay", "python replay"])
def graph_calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A planned call's replay through `GraphCall` (`soagen/runtime/_compiled.c`, where the
    install built it) and through the Python function it stands in for."""
    from soagen.runtime import buffers

    if request.param == "compiled replay" and buffers._GraphCall is None:
        pytest.skip("soagen.runtime._compiled was not built by this install")
    if request.param == "python replay":
        monkeypatch.setattr(buffers, "_GraphCall", None)
    return str(request.param)


def planned(gnn: ModuleType, net: nn.Module, capturer: Any, nodes: Any, edges: Any, scores: Any):  # type: ignore[no-untyped-def]
    """A binding made with graphs=True, called twice with these collections: the first call
    captured, the second made their call plan, which later calls run."""
    from soagen.runtime import buffers

    model = graphed(gnn.EdgeClassifier, net, capturer)
    for _ in range(2):
        model(nodes, edges, out=scores)
    assert len(model._plans) == 1 and capturer.captures == 1
    (plan,) = model._plans.values()
    # The compiled replay where built (the `graph_calls` fixture turns it off for its other run).
    assert buffers._GraphCall is None or isinstance(plan.call, buffers._GraphCall)
    return model


def test_a_planned_call_looks_its_graph_up_on_the_callers_stream_of_each_call(
    gnn: ModuleType, net: nn.Module, monkeypatch: pytest.MonkeyPatch, graph_calls: str
) -> None:
    # The plan fixes the collections' part of the key, past the binding's checks of them
    # (`_run_checked`, never called again); the stream is the caller's at each call.
    capturer = RerunCapturer()
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    model = planned(gnn, net, capturer, nodes, edges, scores)
    assert capturer.replays == 2
    monkeypatch.setattr(model, "_run_checked", None)  # a call through it would raise
    for seed, (stream, captures) in enumerate([(1, 2), (0, 2), (1, 2), (2, 3)], start=2):
        capturer.current_stream = stream
        nodes.block("node_features").copy_(event(gnn, 30, 100, seed)[0].block("node_features"))
        model(nodes, edges, out=scores)
        assert capturer.captures == captures
        assert torch.equal(scores.score, eager_scores(gnn, net, nodes, edges))
    assert len(model._plans) == 1 and len(model._graphs) == 3


class AtCapturedAddresses(RerunCapturer):
    """Its graphs, as CUDA graphs are, are bound to the addresses of the capture: each replay
    asserts the call's collections (`collections`, set by the test) still lie there."""

    collections: tuple[Any, ...] = ()

    def graph(self, run: Callable[[], object]) -> Rerun:
        captured = [collection.buffer.data_ptr() for collection in self.collections]

        def bound() -> None:
            now = [collection.buffer.data_ptr() for collection in self.collections]
            assert now == captured, f"a graph captured at {captured} replayed at {now}"
            run()

        return Rerun(bound, self)


def test_a_planned_call_whose_buffer_storage_moved_captures_again(
    gnn: ModuleType, net: nn.Module, graph_calls: str
) -> None:
    # A collection wrapping the user's tensor shares its storage; resizing that storage moves
    # the buffer under the same collection object, and its plan must not replay the old address.
    capturer = AtCapturedAddresses()
    source, edges = event(gnn, 30, 100, seed=1)
    tensor = aligned_tensor(gnn.Nodes.byte_size(30), gnn.Nodes.ALIGNMENT)
    nodes = gnn.Nodes.wrap(tensor, 30)
    nodes.buffer.copy_(source.buffer)
    scores = gnn.EdgeScores.allocate(100)
    capturer.collections = (nodes, edges, scores)
    model = planned(gnn, net, capturer, nodes, edges, scores)
    address = nodes.buffer.data_ptr()
    storage = tensor.untyped_storage()
    storage.resize_(storage.nbytes() * 64)  # keeps the bytes, at a new address
    assert nodes.buffer.data_ptr() != address
    model(nodes, edges, out=scores)
    assert capturer.captures == 2
    assert torch.equal(scores.score, eager_scores(gnn, net, nodes, edges))


def test_the_least_recently_used_graph_is_dropped_and_freed(
    gnn: ModuleType, net: nn.Module, graph_calls: str
) -> None:
    capturer = RerunCapturer()
    model = graphed(gnn.EdgeClassifier, net, capturer, cache_size=2)
    nodes, edges = event(gnn, 30, 100, seed=1)
    a, b, c = (gnn.EdgeScores.allocate(100) for _ in range(3))
    for out in (a, b, a, c):  # a is checked at its second call; b, never checked, goes for c
        model(nodes, edges, out=out)
    assert len(model._graphs) == 2 and capturer.captures == 3
    assert capturer.alive() == [True, False, True]  # a, b, c: nothing holds b's graph
    model(nodes, edges, out=a)  # replayed
    model(nodes, edges, out=b)  # captured again; c, never checked, goes first
    assert capturer.captures == 4 and capturer.alive() == [True, False, False, True]
    for out in (a, b, c):
        assert torch.equal(out.score, eager_scores(gnn, net, nodes, edges))
    model.close()
    assert len(model._graphs) == 0 and not any(capturer.alive())
    model(nodes, edges, out=a)  # captured anew after close()
    assert capturer.captures == 5


def test_a_new_key_is_kept_when_every_graph_kept_is_checked(
    gnn: ModuleType, net: nn.Module, graph_calls: str
) -> None:
    # Full of graphs checked at their second call: the new key's graph is kept, to be checked at
    # its own second call, and the least recently used checked one goes.
    capturer = RerunCapturer()
    model = graphed(gnn.EdgeClassifier, net, capturer, cache_size=2)
    nodes, edges = event(gnn, 30, 100, seed=1)
    a, b, c = (gnn.EdgeScores.allocate(100) for _ in range(3))
    for out in (a, a, b, b):
        model(nodes, edges, out=out)
    assert capturer.captures == 2 and len(model._graphs._graphs) == 2
    for _ in range(5):
        model(nodes, edges, out=c)
    assert (capturer.warm_ups, capturer.captures) == (6, 3)  # c: captured once, checked once
    assert capturer.alive() == [False, True, True]  # a was the least recently used
    # Keys called once (each event's new buffers): the first takes the place of the least
    # recently used checked graph (b), the later ones each other's; c stays.
    for _ in range(3):
        model(nodes, edges, out=gnn.EdgeScores.allocate(100))
    assert capturer.captures == 6 and capturer.alive()[1:] == [False, True, False, False, True]
    model(nodes, edges, out=c)
    assert capturer.captures == 6
    model(nodes, edges, out=b)
    assert capturer.captures == 7
    for out in (b, c):
        assert torch.equal(out.score, eager_scores(gnn, net, nodes, edges))


def test_a_replay_that_disagrees_is_refused_and_the_outputs_kept(
    gnn: ModuleType, net: nn.Module
) -> None:
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    scores.score.fill_(-7.0)
    capturer = WrongReplays(lambda: scores.score.add_(1e-2))
    model = graphed(gnn.EdgeClassifier, net, capturer)
    for _ in range(2):  # refused at each call: no graph is kept
        with pytest.raises(
            GraphMismatchError,
            match=r"^EdgeClassifier: the CUDA graph .* on output 'edge_scores': 100 of 100 values "
            r"differ.*graphs=False",
        ):
            model(nodes, edges, out=scores)
        assert torch.equal(scores.score, torch.full((100,), -7.0))
        assert len(model._graphs) == 0 and not any(capturer.alive())
    # The check compares within the agreement tolerance: a smaller corruption is let through.
    capturer.corrupt = lambda: scores.score.add_(1e-6)
    model(nodes, edges, out=scores)
    assert len(model._graphs) == 1


class ReplaysWhatItsCaptureComputed(RerunCapturer):
    """Its graphs replay the output values of the call's run at capture, as a CUDA graph does
    whose work ran outside the captured stream (once, at capture, its result left in the pool)."""

    def __init__(self, output: Callable[[], Any]) -> None:
        super().__init__()
        self.output = output

    def capture(self, device: Any, stream: Hashable, run: Callable[[], object]) -> Rerun:
        self.captures += 1
        run()
        computed = self.output().clone()
        graph = Rerun(lambda: self.output().copy_(computed), self)
        self.graphs.append(weakref.ref(graph))
        return graph


def test_a_graph_replaying_what_its_capture_computed_is_caught_at_the_keys_second_call(
    gnn: ModuleType, net: nn.Module, graph_calls: str
) -> None:
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    capturer = ReplaysWhatItsCaptureComputed(lambda: scores.score)
    model = graphed(gnn.EdgeClassifier, net, capturer)
    model(nodes, edges, out=scores)  # its replay of the same values agrees
    assert len(model._graphs) == 1
    refill = event(gnn, 30, 100, seed=2)
    for collection, fresh in zip((nodes, edges), refill, strict=True):
        collection.buffer.copy_(fresh.buffer)
    scores.score.fill_(-7.0)
    with pytest.raises(
        GraphMismatchError,
        match=r"^EdgeClassifier: the CUDA graph replayed at this later call \(node_features "
        r"n=30, edge_index n=100, edge_features n=100\) disagrees with the eager run of the same "
        r"call on output 'edge_scores': .*runs outside the captured stream.*graphs=False$",
    ):
        model(nodes, edges, out=scores)
    assert torch.equal(scores.score, torch.full((100,), -7.0))
    assert len(model._graphs) == 0 and not any(capturer.alive())
    # A graph that replays the call proper passes the same check and is then replayed unchecked.
    honest = RerunCapturer()
    model = graphed(gnn.EdgeClassifier, net, honest)
    for seed in (3, 4, 5):
        for collection, fresh in zip((nodes, edges), event(gnn, 30, 100, seed), strict=True):
            collection.buffer.copy_(fresh.buffer)
        model(nodes, edges, out=scores)
        assert torch.equal(scores.score, eager_scores(gnn, net, nodes, edges))
    assert (honest.warm_ups, honest.captures, honest.replays) == (2, 1, 3)


def test_running_out_of_memory_while_capturing_is_raised_as_it_is_and_not_held_against_the_model(
    mlp: ModuleType,
) -> None:
    class OutOfMemoryOnce(RerunCapturer):
        def capture(self, device: Any, stream: Hashable, run: Callable[[], object]) -> Rerun:
            if not self.captures:
                self.captures += 1
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
            return super().capture(device, stream, run)

    linear = nn.Linear(4, 2)
    capturer = OutOfMemoryOnce()
    model = graphed(mlp.HitMlp, linear, capturer)
    points, scores = hits(mlp, 50, seed=1), mlp.HitScores.allocate(50)
    scores.block("scores").fill_(-7.0)
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        model(points, out=scores)
    assert torch.equal(scores.block("scores"), torch.full((50, 2), -7.0))
    # Not a refusal: the next call captures.
    model(points, out=scores)
    assert capturer.captures == 2 and len(model._graphs) == 1
    with torch.no_grad():
        torch.testing.assert_close(scores.block("scores"), linear(points.block("features")))


def test_running_out_of_memory_in_captures_in_a_row_becomes_a_refusal(mlp: ModuleType) -> None:
    class OutOfMemory(RerunCapturer):
        free = False  # whether the next capture finds the memory it needs

        def capture(self, device: Any, stream: Hashable, run: Callable[[], object]) -> Rerun:
            if self.free:
                return super().capture(device, stream, run)
            self.captures += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    capturer = OutOfMemory()
    model = graphed(mlp.HitMlp, nn.Linear(4, 2), capturer)
    points, scores = hits(mlp, 50, seed=1), mlp.HitScores.allocate(50)
    # A capture that succeeds between them starts the count again.
    for _ in range(OUT_OF_MEMORY_REFUSAL - 1):
        with pytest.raises(torch.OutOfMemoryError):
            model(points, out=scores)
    capturer.free = True
    model(points, out=mlp.HitScores.allocate(50))
    capturer.free = False
    for _ in range(OUT_OF_MEMORY_REFUSAL - 1):
        with pytest.raises(torch.OutOfMemoryError):
            model(points, out=scores)
    for _ in range(2):  # the last one captured, and refused since
        with pytest.raises(
            GraphCaptureError,
            match=rf"^HitMlp: .* ran out of device memory in {OUT_OF_MEMORY_REFUSAL} captures in "
            r"a row: CUDA out of memory.*graphs=False$",
        ):
            model(points, out=scores)
    assert capturer.captures == 2 * OUT_OF_MEMORY_REFUSAL


def test_a_call_needing_a_capture_inside_another_capture_is_refused_that_once(
    mlp: ModuleType,
) -> None:
    linear = nn.Linear(4, 2)
    capturer = RerunCapturer()
    model = graphed(mlp.HitMlp, linear, capturer)
    points, scores = hits(mlp, 50, seed=1), mlp.HitScores.allocate(50)
    scores.block("scores").fill_(-7.0)
    capturer.capturing_now = True  # inside the caller's own torch.cuda.graph, say
    for _ in range(2):
        with pytest.raises(
            GraphCaptureError,
            match=r"^HitMlp: called while the caller's CUDA stream .* is being "
            r"captured .*captures do not nest.*graphs=False$",
        ):
            model(points, out=scores)
    assert torch.equal(scores.block("scores"), torch.full((50, 2), -7.0))
    assert capturer.warm_ups == capturer.captures == 0
    capturer.capturing_now = False  # outside it, the binding captures as ever
    for _ in range(2):
        model(points, out=scores)
    assert (capturer.warm_ups, capturer.captures, capturer.replays) == (2, 1, 2)


def test_a_model_writing_its_inputs_is_caught_before_anything_is_captured(
    mlp: ModuleType,
) -> None:
    capturer = RerunCapturer()
    model = graphed(mlp.HitMlp, WritesItsInput(), capturer)
    points, scores = hits(mlp, 50, seed=1), mlp.HitScores.allocate(50)
    with pytest.raises(InputModifiedError, match="'features'"):
        model(points, out=scores)
    assert capturer.captures == 0 and len(model._graphs) == 0


def test_protected_inputs_are_copied_inside_the_captured_call(mlp: ModuleType) -> None:
    capturer = RerunCapturer()
    net = WritesItsInput()
    model = graphed(mlp.HitMlp, net, capturer, protect_inputs=True)
    points, scores = hits(mlp, 50, seed=1), mlp.HitScores.allocate(50)
    original = points.buffer.clone()
    for _ in range(3):
        model(points, out=scores)
    assert capturer.replays == 3 and torch.equal(points.buffer, original)
    with torch.no_grad():
        expected = net.linear(points.block("features") * 2.0)
    assert torch.equal(scores.block("scores"), expected)


def test_a_model_that_waits_for_the_device_is_refused_at_capture_writing_nothing(
    mlp: ModuleType,
) -> None:
    capturer = RunsThePythonAtCapture()
    model = graphed(mlp.HitMlp, WaitsForTheDevice(), capturer)
    points, scores = hits(mlp, 50, seed=1), mlp.HitScores.allocate(50)
    scores.block("scores").fill_(-7.0)
    with pytest.raises(
        GraphCaptureError,
        match=r"^HitMlp: WaitsForTheDevice on cpu cannot be captured into a CUDA graph: "
        r"RuntimeError: CUDA error: operation not permitted when stream is capturing\. "
        r".*\.item\(\).*graphs=False$",
    ) as raised:
        model(points, out=scores)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert torch.equal(scores.block("scores"), torch.full((50, 2), -7.0))
    assert capturer.captures == 0 and len(model._graphs) == 0
    # Refused again, on other collections too, without warming up or capturing the model again.
    net, others = model._backend.module, hits(mlp, 20, seed=2)
    calls = CountsCalls(net)
    with pytest.raises(GraphCaptureError, match=r"^HitMlp: WaitsForTheDevice on cpu .*item"):
        model(others, out=mlp.HitScores.allocate(20))
    assert calls.count == 0 and capturer.captures == 0


def test_an_error_while_capturing_propagates_and_leaves_the_outputs(mlp: ModuleType) -> None:
    class FailsAtItsThirdCall(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls == WARM_UP_CALLS + 1:  # after the warm-up runs: while capturing
                raise ValueError("the model's own error")
            return features[:, :2] * 2.0

    model = graphed(mlp.HitMlp, FailsAtItsThirdCall(), RunsThePythonAtCapture())
    points, scores = hits(mlp, 50, seed=1), mlp.HitScores.allocate(50)
    scores.block("scores").fill_(-7.0)
    with pytest.raises(ValueError, match="the model's own error"):
        model(points, out=scores)
    assert torch.equal(scores.block("scores"), torch.full((50, 2), -7.0))
    assert len(model._graphs) == 0


def test_index_values_are_checked_inside_every_replay(
    gnn: ModuleType, net: nn.Module, graph_calls: str
) -> None:
    capturer = RerunCapturer()
    model = graphed(gnn.EdgeClassifier, net, capturer)
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    for _ in range(2):  # captured, then checked again at the second call
        model(nodes, edges, out=scores)
    scores.score.fill_(-7.0)
    edges.src[7] = 30  # the same buffers, so the same graph
    with pytest.raises(IndexRangeError, match=r"'edge_index' holds indices outside \[0, 30\)"):
        model(nodes, edges, out=scores)
    assert (capturer.warm_ups, capturer.captures, capturer.replays) == (2, 1, 3)
    assert torch.equal(scores.score, torch.full((100,), -7.0))


def test_a_module_back_in_training_mode_is_refused_not_replayed(
    gnn: ModuleType, graph_calls: str
) -> None:
    capturer, net = RerunCapturer(), build_model()
    model = graphed(gnn.EdgeClassifier, net, capturer)
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    model(nodes, edges, out=scores)
    net.train()
    with pytest.raises(ModelLoadError, match="training mode"):
        model(nodes, edges, out=scores)
    assert capturer.replays == 1
    net.eval()
    model(nodes, edges, out=scores)
    assert (capturer.captures, capturer.replays) == (1, 2)


def test_cpu_collections_run_as_usual(gnn: ModuleType, net: nn.Module) -> None:
    model = gnn.EdgeClassifier(net, graphs=True)  # the CUDA capturer: CPU calls are plain ones
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores, batched = gnn.EdgeScores.allocate(100), gnn.EdgeScores.allocate(100)
    model(nodes, edges, out=scores)
    assert torch.equal(scores.score, eager_scores(gnn, net, nodes, edges))
    model(nodes, edges, out=scores, batch_size=64)  # batch_size too, refused only where captured
    gnn.EdgeClassifier(net)(nodes, edges, out=batched, batch_size=64)
    assert torch.equal(scores.score, batched.score)
    assert model._graphs is not None and len(model._graphs) == 0


def test_batch_size_is_refused_where_calls_are_captured(gnn: ModuleType, net: nn.Module) -> None:
    model = graphed(gnn.EdgeClassifier, net, RerunCapturer())
    nodes, edges = event(gnn, 30, 100, seed=1)
    with pytest.raises(BindingError, match=r"^batch_size: .*graphs=True.*graphs=False$"):
        model(nodes, edges, out=gnn.EdgeScores.allocate(100), batch_size=64)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"graphs": True, "graph_cache_size": 0}, ValueError, "graph_cache_size must be"),
        ({"graphs": True, "graph_cache_size": True}, ValueError, "graph_cache_size must be"),
        ({"graphs": True, "graph_cache_size": "8"}, ValueError, "graph_cache_size must be"),
        ({"graphs": "yes"}, ValueError, "graphs must be True or False"),
        ({"graph_cache_size": 4}, BindingError, "pass graphs=True with it"),
    ],
)
def test_graph_options_are_checked(
    gnn: ModuleType, net: nn.Module, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        gnn.EdgeClassifier(net, **options)


def test_backends_that_cannot_be_captured_are_refused_at_construction(
    gnn: ModuleType, net: nn.Module, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    from soagen.serving.client import _ServerBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.randn(16, 4), torch.randint(0, 16, (2, 64)), torch.rand(64, 2)),
            str(tmp_path / "gnn.onnx"),
            dynamo=False,
            opset_version=17,
            input_names=["node_features", "edge_index", "edge_features"],
            output_names=["edge_scores"],
            dynamic_axes={
                "node_features": {0: "nodes"},
                "edge_index": {1: "edges"},
                "edge_features": {0: "edges"},
                "edge_scores": {0: "edges"},
            },
        )
    with pytest.raises(BindingError, match=r"\(onnxruntime\).*its own.*graphs=False$"):
        gnn.EdgeClassifier.load(tmp_path / "gnn.onnx", graphs=True)
    gnn.EdgeClassifier.load(tmp_path / "gnn.onnx")  # the file itself is fine
    server = _ServerBackend("127.0.0.1:8001", "EdgeClassifier")
    with pytest.raises(BindingError, match=r"\(remote\).*requests the server answers"):
        gnn.EdgeClassifier(server, graphs=True)


def test_an_aot_package_is_replayed_through_its_single_threaded_runner(
    gnn: ModuleType, net: nn.Module, gnn_build: tuple[Path, str, str]
) -> None:
    # CPU package, CPU double: the loader AOTInductor gives a binding with graphs=True, for real.
    capturer = RerunCapturer()
    model = graphed(gnn.EdgeClassifier.load, gnn_build[0], capturer)
    assert model._backend.single_threaded
    assert not gnn.EdgeClassifier.load(gnn_build[0])._backend.single_threaded
    nodes, edges = event(gnn, 30, 100, seed=1)
    scores = gnn.EdgeScores.allocate(100)
    for seed in (2, 3):
        model(nodes, edges, out=scores)
        expected = eager_scores(gnn, net, nodes, edges)
        torch.testing.assert_close(scores.score, expected, rtol=1e-4, atol=1e-5)
        fresh_nodes, fresh_edges = event(gnn, 30, 100, seed=seed)
        nodes.buffer.copy_(fresh_nodes.buffer)
        edges.buffer.copy_(fresh_edges.buffer)
    assert (capturer.captures, capturer.replays) == (1, 2)


# --- CUDA: the capturer itself -------------------------------------------------------------------

SIZES = [(1, 1), (3, 2), (40, 129), (300, 1000), (2_001, 50_003)]


def refill(gnn: ModuleType, nodes: Any, edges: Any, seed: int) -> None:
    """New values in the same buffers (on the current stream, as replays read them)."""
    fresh_nodes, fresh_edges = event(gnn, nodes.size, edges.size, seed, "cuda")
    nodes.buffer.copy_(fresh_nodes.buffer)
    edges.buffer.copy_(fresh_edges.buffer)


@cuda
@pytest.mark.parametrize("backend", ["eager", "torchscript", "compile"])
def test_cuda_replays_equal_eager_calls_at_every_size(gnn: ModuleType, backend: str) -> None:
    net = build_model().cuda()
    if backend == "torchscript":
        model = gnn.EdgeClassifier(torch.jit.script(net), graphs=True)
    else:  # torch.compile compiles at the first warm-up run, before anything is captured
        model = gnn.EdgeClassifier(net, backend=backend, graphs=True)
    plain = gnn.EdgeClassifier(net)
    for seed, (n_nodes, n_edges) in enumerate(SIZES):
        nodes, edges = event(gnn, n_nodes, n_edges, seed, "cuda")
        scores = gnn.EdgeScores.allocate(n_edges, device="cuda")
        expected = gnn.EdgeScores.allocate(n_edges, device="cuda")
        for replay in range(3):  # the capture's check, then replays of new values
            refill(gnn, nodes, edges, 100 * seed + replay)
            model(nodes, edges, out=scores)
            plain(nodes, edges, out=expected)
            torch.testing.assert_close(scores.score, expected.score, rtol=1e-4, atol=1e-5)
    assert len(model._graphs) == len(SIZES)


@cuda
def test_cuda_mlp_replays_equal_eager_calls(mlp: ModuleType) -> None:
    from benchmarks.models import build_mlp

    net = build_mlp().cuda()
    model, plain = mlp.HitMlp(net, graphs=True), mlp.HitMlp(net)
    for n in (1, 33, 1_000, 100_003):
        points = hits(mlp, n, seed=n, device="cuda")
        scores = mlp.HitScores.allocate(n, device="cuda")
        expected = mlp.HitScores.allocate(n, device="cuda")
        for seed in range(3):
            points.block("features").copy_(hits(mlp, n, seed=seed, device="cuda").block("features"))
            model(points, out=scores)
            plain(points, out=expected)
            torch.testing.assert_close(
                scores.block("scores"), expected.block("scores"), rtol=1e-4, atol=1e-5
            )


BAD_INDEX_ON_REPLAY = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes
    nodes = Nodes.allocate(30, device="cuda", zero=True)
    edges = Edges.allocate(100, device="cuda", zero=True)
    edges.block("edge_index").copy_(torch.randint(0, 30, (2, 100)))
    scores = EdgeScores.allocate(100, device="cuda")
    model = EdgeClassifier(build_model().cuda(), graphs=True)
    for _ in range(2):  # captured, then checked again at its second call
        model(nodes, edges, out=scores)
    torch.cuda.synchronize()
    print("captured", len(model._graphs), flush=True)
    edges.src[7] = int(sys.argv[2])
    model(nodes, edges, out=scores)
    torch.cuda.synchronize()
    print("replayed", len(model._graphs), flush=True)
    """
)


@cuda
@pytest.mark.parametrize("bad", [30, -1])
def test_cuda_a_bad_index_written_between_replays_stops_the_replay(bad: int) -> None:
    # A device-side assert ends the CUDA context: each case runs in a process of its own.
    done = subprocess.run(
        [sys.executable, "-c", BAD_INDEX_ON_REPLAY, str(REPO), str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "captured 1" in done.stdout, done.stderr
    assert done.returncode != 0 and "replayed" not in done.stdout
    assert "holds indices outside [0, n)" in done.stderr or "device-side assert" in done.stderr
    good = subprocess.run(
        [sys.executable, "-c", BAD_INDEX_ON_REPLAY, str(REPO), "29"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert good.returncode == 0 and "replayed 1" in good.stdout, good.stderr


@cuda
def test_cuda_a_replayed_call_is_one_graph_launch_with_no_host_device_copy(
    gnn: ModuleType,
) -> None:
    from torch.profiler import ProfilerActivity, profile

    model = gnn.EdgeClassifier(build_model().cuda(), graphs=True)
    nodes, edges = event(gnn, 2_000, 20_000, seed=4, device="cuda")
    scores = gnn.EdgeScores.allocate(edges.size, device="cuda")
    for _ in range(2):  # captured, then checked again at its second call
        model(nodes, edges, out=scores)
    stream = torch.cuda.current_stream()
    assert_no_host_device_copies(lambda: model(nodes, edges, out=scores), stream)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as profiled:
        model(nodes, edges, out=scores)
    stream.synchronize()
    names = [event.name for event in profiled.events()]
    assert [name for name in names if "GraphLaunch" in name], names
    assert not [name for name in names if name in ("cudaLaunchKernel", "cudaLaunchKernelExC")]
    expected = eager_scores(gnn, build_model().cuda(), nodes, edges)
    torch.testing.assert_close(scores.score, expected, rtol=1e-4, atol=1e-5)


@cuda
def test_cuda_a_model_that_waits_for_the_device_is_refused_and_cuda_stays_usable(
    mlp: ModuleType,
) -> None:
    net = WaitsForTheDevice().cuda()
    model = mlp.HitMlp(net, graphs=True)
    points, scores = (
        hits(mlp, 100, seed=1, device="cuda"),
        mlp.HitScores.allocate(100, device="cuda"),
    )
    scores.block("scores").fill_(-7.0)
    with pytest.raises(GraphCaptureError, match=r"^HitMlp: .*\.item\(\).*graphs=False$"):
        model(points, out=scores)
    assert torch.equal(scores.block("scores").cpu(), torch.full((100, 2), -7.0))
    assert len(model._graphs) == 0
    mlp.HitMlp(net)(points, out=scores)  # a plain binding runs it
    assert float(scores.block("scores").abs().sum()) > 0
    # What the failed capture left in torch is undone: random numbers on the GPU (the generator
    # left in capture mode by torch < 2.13), and another capture for the same stream (its pool).
    assert torch.randn(8, device="cuda").isfinite().all()
    linear = nn.Linear(4, 2).cuda()
    graphed_scores = mlp.HitScores.allocate(100, device="cuda")
    captured = mlp.HitMlp(linear, graphs=True)
    for _ in range(2):
        captured(points, out=graphed_scores)
    assert len(captured._graphs) == 1
    with torch.no_grad():
        expected = linear(points.block("features"))
    torch.testing.assert_close(graphed_scores.block("scores"), expected)


@cuda
def test_cuda_a_model_writing_its_inputs_is_caught_and_protected_inputs_are_copied_each_replay(
    mlp: ModuleType,
) -> None:
    points, scores = (
        hits(mlp, 100, seed=1, device="cuda"),
        mlp.HitScores.allocate(100, device="cuda"),
    )
    original = points.buffer.clone()
    with pytest.raises(InputModifiedError):
        mlp.HitMlp(WritesItsInput().cuda(), graphs=True)(points, out=scores)
    points.buffer.copy_(original)
    net = WritesItsInput().cuda()
    model = mlp.HitMlp(net, graphs=True, protect_inputs=True)
    for _ in range(3):
        model(points, out=scores)
    assert torch.equal(points.buffer, original)
    with torch.no_grad():
        expected = net.linear(points.block("features") * 2.0)
    torch.testing.assert_close(scores.block("scores"), expected)


@cuda
def test_cuda_dropped_graphs_are_destroyed_and_streams_are_keys(gnn: ModuleType) -> None:
    net = build_model().cuda()
    model = gnn.EdgeClassifier(net, graphs=True, graph_cache_size=1)
    nodes, edges = event(gnn, 300, 1_000, seed=2, device="cuda")
    first, second = (gnn.EdgeScores.allocate(1_000, device="cuda") for _ in range(2))
    model(nodes, edges, out=first)
    (kept,) = model._graphs._unconfirmed.values()
    graph = weakref.ref(kept._held[0])
    del kept
    model(nodes, edges, out=second)
    assert graph() is None and len(model._graphs) == 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    model(nodes, edges, out=first, stream=stream)
    torch.cuda.current_stream().wait_stream(stream)
    expected = eager_scores(gnn, net, nodes, edges)
    for out in (first, second):
        torch.testing.assert_close(out.score, expected, rtol=1e-4, atol=1e-5)
    # Every graph of the stream's pool gone: a later capture for that stream still works (torch
    # takes a pool whose last user went for gone; the capturer's anchor holds it).
    model.close()
    del model
    gc.collect()
    again = gnn.EdgeClassifier(net, graphs=True)
    third = gnn.EdgeScores.allocate(1_000, device="cuda")
    for _ in range(2):
        again(nodes, edges, out=third)
    assert len(again._graphs) == 1
    torch.testing.assert_close(third.score, expected, rtol=1e-4, atol=1e-5)


@cuda
def test_cuda_the_capturer_keeps_the_pools_of_the_latest_streams(mlp: ModuleType) -> None:
    linear = nn.Linear(4, 2).cuda()
    model = mlp.HitMlp(linear, graphs=True)
    points = hits(mlp, 100, seed=1, device="cuda")
    with torch.no_grad():
        expected = linear(points.block("features"))
    streams = [torch.cuda.Stream() for _ in range(STREAMS_KEPT + 2)]
    for stream in [*streams, streams[0]]:  # the first again, after its pool was dropped
        scores = mlp.HitScores.allocate(100, device="cuda")
        stream.wait_stream(torch.cuda.current_stream())
        for _ in range(2):
            model(points, out=scores, stream=stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.testing.assert_close(scores.block("scores"), expected)
    assert len(cuda_capturer()._sides) <= STREAMS_KEPT


@cuda
def test_cuda_a_first_call_inside_the_callers_own_capture_is_refused(mlp: ModuleType) -> None:
    linear = nn.Linear(4, 2).cuda()
    model = mlp.HitMlp(linear, graphs=True)
    points = hits(mlp, 100, seed=1, device="cuda")
    scores = mlp.HitScores.allocate(100, device="cuda")
    outer = torch.cuda.CUDAGraph()
    with pytest.raises(GraphCaptureError, match="is being captured"):
        with torch.cuda.graph(outer):
            model(points, out=scores)
    for _ in range(3):  # outside it: captured, checked, replayed
        model(points, out=scores)
    assert len(model._graphs) == 1
    with torch.no_grad():
        expected = linear(points.block("features"))
    torch.testing.assert_close(scores.block("scores"), expected)


@cuda
def test_cuda_every_capture_lets_other_threads_wait_for_the_device(
    mlp: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each new stream's pool is anchored by a capture of its own (`_anchored_pool`): like the
    # calls' captures, it must not make another thread's host wait fail. The waits below race
    # with the captures; the modes recorded say it of every capture, race or not.
    modes: list[str] = []
    begin = torch.cuda.CUDAGraph.capture_begin

    def recording(self: Any, pool: Any = None, capture_error_mode: str = "global") -> None:
        modes.append(capture_error_mode)
        begin(self, pool=pool, capture_error_mode=capture_error_mode)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", recording)
    linear = nn.Linear(4, 2).cuda()
    model = mlp.HitMlp(linear, graphs=True)
    points = hits(mlp, 100, seed=1, device="cuda")
    stop, errors = threading.Event(), []

    def waits() -> None:
        counter = torch.zeros(1, device="cuda")
        try:
            while not stop.is_set():
                counter.add_(1).item()
        except BaseException as error:  # reported below
            errors.append(error)

    waiter = threading.Thread(target=waits)
    waiter.start()
    current = torch.cuda.current_stream()
    try:
        for _ in range(12):
            stream = torch.cuda.Stream()
            stream.wait_stream(current)
            scores = mlp.HitScores.allocate(100, device="cuda")
            for _ in range(2):
                model(points, out=scores, stream=stream)
            current.wait_stream(stream)
    finally:
        stop.set()
        waiter.join(30)
    assert not errors, errors
    assert modes and set(modes) == {"thread_local"}, modes


@cuda
def test_cuda_aot_package_replays_equal_eager_calls(gnn: ModuleType, tmp_path: Path) -> None:
    # Two sizes, each captured and replayed: the package's runner is called again after a
    # capture (the second key's warm-up), which its thread-aware entry point could not do.
    from soagen.build.compile import compile_model

    package = compile_model(
        REPO / "schemas" / "gnn.soa",
        "EdgeClassifier",
        str(REPO / "examples" / "gnn_model.py:build_model"),
        output=tmp_path / "gnn.pt2",
        device="cuda",
    )
    net = build_model().cuda()
    model = gnn.EdgeClassifier.load(package, graphs=True)
    events = [
        event(gnn, n_nodes, n_edges, seed, "cuda")
        for seed, (n_nodes, n_edges) in enumerate(SIZES[2:])
    ]
    outputs = [gnn.EdgeScores.allocate(edges.size, device="cuda") for _, edges in events]
    for round in range(3):
        for seed, ((nodes, edges), scores) in enumerate(zip(events, outputs, strict=True)):
            refill(gnn, nodes, edges, 10 * round + seed)
            model(nodes, edges, out=scores)
            expected = eager_scores(gnn, net, nodes, edges)
            torch.testing.assert_close(scores.score, expected, rtol=1e-4, atol=1e-5)
    assert len(model._graphs) == len(events)
