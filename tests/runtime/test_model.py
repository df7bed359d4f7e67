"""Model binding: collections in, zero-copy blocks to the model, validated outputs written back."""

from __future__ import annotations

import threading
import typing
from pathlib import Path

import pytest
import torch
from torch import nn

from soagen.runtime.model import BindingError, IndexRangeError, InputModifiedError, OutputError
from tests.helpers import generate_package, import_generated

MLP_SCHEMA = """
layout Points {
    align 64
    column float32 x, y, z
    column int64 label
}
layout Scores {
    column float32 a, b
}
model Mlp {
    input points = Points{x, y, z} as [n, c]
    output scores = Scores{a, b} as [n, c]
}
model Transposed {
    input points_t = Points{x, y, z} as [c, n]
    output scores_t = Scores{a, b} as [c, n]
}
model AllWhole {
    input points = Points{x, y, z} as [n, c] whole
    output scores = Scores{a, b} as [n, c]
}
model Neighbours {
    input points = Points{x, y, z} as [n, c]
    input neighbour = Points{label} as [n] indexes points
    output scores = Scores{a, b} as [n, c]
}
"""


@pytest.fixture(scope="module")
def mlp_module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("model")
    (root / "mlp.soa").write_text(MLP_SCHEMA)
    generate_package(root / "mlp.soa", root, "pkg_model")
    return import_generated(root, "pkg_model", "mlp")


def _points(module, n: int):  # type: ignore[no-untyped-def]
    points = module.Points.allocate(n)
    generator = torch.Generator().manual_seed(n)
    for name in ("x", "y", "z"):
        points.member(name).copy_(torch.randn(n, generator=generator))
    points.label.copy_(torch.arange(n))
    return points


class Linear32(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 2)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.layer(points)


def test_gnn_round_trip_matches_model_on_contiguous_tensors() -> None:
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    nodes, edges = Nodes.allocate(300), Edges.allocate(1000)
    generator = torch.Generator().manual_seed(1)
    nodes.block("node_features").copy_(torch.randn(300, 4, generator=generator))
    edges.block("edge_index").copy_(torch.randint(0, 300, (2, 1000), generator=generator))
    edges.block("edge_features").copy_(torch.rand(1000, 2, generator=generator))
    scores = EdgeScores.allocate(1000)
    net = build_model()
    model = EdgeClassifier(net)
    before = nodes.buffer.clone(), edges.buffer.clone()
    model(nodes, edges, out=scores)
    with torch.no_grad():
        expected = net(
            nodes.block("node_features").contiguous(),
            edges.block("edge_index").contiguous(),
            edges.block("edge_features").contiguous(),
        )
    torch.testing.assert_close(scores.score, expected)
    assert torch.equal(nodes.buffer, before[0]) and torch.equal(edges.buffer, before[1])
    # Collections given by binding name run the same.
    scores.score.zero_()
    model.run(
        {"node_features": nodes, "edge_index": edges, "edge_features": edges},
        {"edge_scores": scores},
    )
    torch.testing.assert_close(scores.score, expected)


def test_model_sees_the_zero_copy_views(mlp_module) -> None:  # type: ignore[no-untyped-def]
    seen: list[torch.Tensor] = []

    class Spy(nn.Module):
        def forward(self, points: torch.Tensor) -> torch.Tensor:
            seen.append(points)
            return points[:, :2] * 2

    points, scores = _points(mlp_module, 100), mlp_module.Scores.allocate(100)
    mlp_module.Mlp(Spy())(points, out=scores)
    view = points.block("points")
    assert seen[0].data_ptr() == view.data_ptr() == points.buffer.data_ptr()
    assert seen[0].stride() == view.stride() == (1, 64 // 4 * 7)  # pitch of 100 float32 at align 64
    torch.testing.assert_close(scores.a, points.x * 2)


@pytest.mark.parametrize("binding", ["Mlp", "Transposed"])
def test_outputs_are_written_in_every_axis_order(mlp_module, binding: str) -> None:  # type: ignore[no-untyped-def]
    points, scores = _points(mlp_module, 37), mlp_module.Scores.allocate(37)
    net = Linear32()
    if binding == "Transposed":

        class T(nn.Module):
            def forward(self, p: torch.Tensor) -> torch.Tensor:
                return net(p.t()).t()

        model = mlp_module.Transposed(T())
    else:
        model = mlp_module.Mlp(net)
    model(points, out=scores)
    with torch.no_grad():
        expected = net(torch.stack([points.x, points.y, points.z], 1))
    torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), expected)


@pytest.mark.parametrize(
    "output, message",
    [
        (lambda p: p[:, :2].double(), "dtype torch.float64, expected torch.float32"),
        (lambda p: p, "shape [20, 3], expected [20, 2]"),
        (lambda p: (p[:, :2], p[:, :2]), "returned 2 output(s)"),
        (
            lambda p: p[:10, :2],
            "the model returned 10 elements, but its output collection (Scores) holds 20",
        ),
    ],
)
def test_bad_outputs_are_refused_and_nothing_written(mlp_module, output, message: str) -> None:  # type: ignore[no-untyped-def]
    class Bad(nn.Module):
        def forward(self, p: torch.Tensor):  # type: ignore[no-untyped-def]
            return output(p)

    points, scores = _points(mlp_module, 20), mlp_module.Scores.allocate(20)
    scores.buffer.fill_(7)
    with pytest.raises(
        OutputError,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        mlp_module.Mlp(Bad())(points, out=scores)
    assert bool((scores.buffer == 7).all())


def test_model_raising_propagates_and_writes_nothing(mlp_module) -> None:  # type: ignore[no-untyped-def]
    class Raises(nn.Module):
        def forward(self, p: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("model failed")

    points, scores = _points(mlp_module, 5), mlp_module.Scores.allocate(5)
    scores.buffer.fill_(3)
    with pytest.raises(RuntimeError, match="model failed"):
        mlp_module.Mlp(Raises())(points, out=scores)
    assert bool((scores.buffer == 3).all())


class WritesInput(nn.Module):
    def forward(self, points: torch.Tensor) -> torch.Tensor:
        points *= 2  # some real taggers mask their inputs in place
        return points[:, :2]


def test_model_writing_its_inputs_is_caught(mlp_module) -> None:  # type: ignore[no-untyped-def]
    points, scores = _points(mlp_module, 8), mlp_module.Scores.allocate(8)
    with pytest.raises(InputModifiedError, match="wrote into its input 'points'"):
        mlp_module.Mlp(WritesInput())(points, out=scores)


def test_protect_inputs_runs_on_copies(mlp_module) -> None:  # type: ignore[no-untyped-def]
    points, scores = _points(mlp_module, 8), mlp_module.Scores.allocate(8)
    before = points.buffer.clone()
    mlp_module.Mlp(WritesInput(), protect_inputs=True)(points, out=scores)
    assert torch.equal(points.buffer, before)
    torch.testing.assert_close(scores.a, points.x * 2)


def test_batches_start_aligned_and_cover_everything(mlp_module) -> None:  # type: ignore[no-untyped-def]
    starts: list[int] = []
    points = _points(mlp_module, 1000)
    base = points.block("points").data_ptr()

    class Record(nn.Module):
        def forward(self, p: torch.Tensor) -> torch.Tensor:
            starts.append((p.data_ptr() - base) // 4)
            return p[:, :2] + 1

    scores = mlp_module.Scores.allocate(1000)
    mlp_module.Mlp(Record())(points, out=scores, batch_size=100)
    # Points (align 64) needs starts at multiples of 16 float32, Scores (align 128) of 32: 100 -> 128.
    assert starts == list(range(0, 1000, 128))
    assert all((points.block("points").data_ptr() + s * 4) % 64 == 0 for s in starts)
    torch.testing.assert_close(scores.b, points.y + 1)


def test_a_failing_slice_writes_no_output(mlp_module) -> None:  # type: ignore[no-untyped-def]
    calls: list[int] = []
    failing = [True]

    class FailsAtTheFourthSlice(nn.Module):
        def forward(self, p: torch.Tensor) -> torch.Tensor:
            calls.append(p.shape[0])
            if failing[0] and len(calls) == 4:
                raise RuntimeError("slice 4 is bad")
            return p[:, :2] + 1

    points = _points(mlp_module, 1000)
    scores = mlp_module.Scores.allocate(1000, zero=True)
    scores.a.fill_(-7.0)
    before = scores.buffer.clone()
    model = mlp_module.Mlp(FailsAtTheFourthSlice())
    with pytest.raises(RuntimeError, match="slice 4 is bad"):
        model(points, out=scores, batch_size=100)
    assert calls == [128] * 4  # three slices ran before the failure
    assert torch.equal(scores.buffer, before)  # and none of their results were written
    failing[0] = False
    model(points, out=scores, batch_size=100)
    torch.testing.assert_close(scores.a, points.x + 1)
    torch.testing.assert_close(scores.b, points.y + 1)


def test_batch_size_needs_equal_sizes(mlp_module) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BindingError, match="same size"):
        mlp_module.Mlp(Linear32())(
            _points(mlp_module, 4), out=mlp_module.Scores.allocate(6), batch_size=2
        )


def test_wrong_collections_are_refused(mlp_module) -> None:  # type: ignore[no-untyped-def]
    model = mlp_module.Mlp(Linear32())
    points, scores = _points(mlp_module, 4), mlp_module.Scores.allocate(4)
    with pytest.raises(TypeError, match="points"):
        model(out=scores)
    with pytest.raises(BindingError, match="Mlp.points binds Points, got Scores"):
        model(scores, out=scores)
    with pytest.raises(BindingError, match=r"Mlp.scores \(out=\) binds Scores, got Points"):
        model(points, out=points)
    with pytest.raises(BindingError, match="Mlp.points binds Points, got Tensor"):
        model(torch.zeros(3), out=scores)
    with pytest.raises(BindingError, match="inputs points; got points, extra"):
        model.run({"points": points, "extra": points}, {"scores": scores})
    with pytest.raises(BindingError, match="one device"):
        model(points, out=scores.to("meta"))


def test_wrong_collections_are_refused_after_good_calls(mlp_module) -> None:  # type: ignore[no-untyped-def]
    # Checks are remembered per combination of collection classes: a good call must not let a
    # later wrong one through, in either argument order.
    model = mlp_module.Mlp(Linear32())
    points, scores = _points(mlp_module, 4), mlp_module.Scores.allocate(4)
    model(points, out=scores)
    model.run({"points": points}, {"scores": scores})
    with pytest.raises(BindingError, match="Mlp.points binds Points, got Scores"):
        model(scores, out=scores)
    with pytest.raises(BindingError, match=r"Mlp.scores \(out=\) binds Scores, got Points"):
        model(points, out=points)
    with pytest.raises(BindingError, match="inputs points; got scores"):
        model.run({"scores": points}, {"points": scores})
    with pytest.raises(BindingError, match="one device"):
        model(points, out=scores.to("meta"))
    model(points, out=scores)


def test_generated_call_is_typed(mlp_module) -> None:  # type: ignore[no-untyped-def]
    import inspect

    signature = inspect.signature(mlp_module.Mlp.__call__)
    assert list(signature.parameters) == ["self", "points", "out", "stream", "batch_size"]
    assert signature.parameters["points"].annotation == "Points"
    assert signature.parameters["out"].kind is inspect.Parameter.KEYWORD_ONLY
    assert signature.parameters["out"].annotation == "Scores"


def test_empty_outputs_skip_the_model(mlp_module) -> None:  # type: ignore[no-untyped-def]
    class Never(nn.Module):
        def forward(self, p: torch.Tensor) -> torch.Tensor:
            raise AssertionError("called")

    mlp_module.Mlp(Never())(_points(mlp_module, 0), out=mlp_module.Scores.allocate(0))


@pytest.mark.parametrize("backend", ["eager", "torchscript", "compile"])
def test_one_model_object_from_many_threads(mlp_module, backend: str) -> None:  # type: ignore[no-untyped-def]
    def built() -> object:
        net = Linear32()
        return torch.jit.script(net) if backend == "torchscript" else net

    inputs = [_points(mlp_module, n) for n in (50, 51, 52, 53)]
    reference = mlp_module.Mlp(built(), backend=backend)
    serial = []
    for points in inputs:
        scores = mlp_module.Scores.allocate(points.size)
        reference(points, out=scores)
        serial.append(scores.block("scores").clone())
    # A fresh object: the threads' first calls race for its placement (and its compilation).
    model = mlp_module.Mlp(built(), backend=backend)
    start = threading.Barrier(8)
    failures: list[str] = []

    def worker(index: int) -> None:
        try:
            start.wait()
            for call in range(20):
                which = (index + call) % 4
                scores = mlp_module.Scores.allocate(inputs[which].size)
                model(inputs[which], out=scores)
                if not torch.equal(scores.block("scores"), serial[which]):
                    failures.append(f"thread {index}, call {call}: results differ")
        except BaseException as error:  # reported below, not lost in the thread
            failures.append(f"thread {index}: {error!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_binding_lookup(mlp_module) -> None:  # type: ignore[no-untyped-def]
    assert mlp_module.Mlp.binding("scores").direction == "output"
    with pytest.raises(KeyError, match="bindings are points, scores"):
        mlp_module.Mlp.binding("nope")


def test_load_missing_file_is_clear(mlp_module, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((FileNotFoundError, ValueError), match="missing.pt2"):
        mlp_module.Mlp.load(tmp_path / "missing.pt2")


def test_contiguous_inputs_are_row_major_copies(mlp_module) -> None:  # type: ignore[no-untyped-def]
    seen: list[torch.Tensor] = []

    class Spy(nn.Module):
        def forward(self, points: torch.Tensor) -> torch.Tensor:
            seen.append(points)
            return points[:, :2] * 2

    # 4096: float32 columns with no padding (pitch == n), whose [n, 3] view is a transposed
    # contiguous matrix; `soagen.runtime.buffers.contiguous_copy` copies it without ATen's tiles.
    for n in (40, 4096):
        points, scores = _points(mlp_module, n), mlp_module.Scores.allocate(n)
        assert (points.block("points").stride(1) == n) == (n == 4096)
        seen.clear()
        mlp_module.Mlp(Spy(), contiguous=["points"])(points, out=scores)
        assert seen[0].is_contiguous() and seen[0].data_ptr() != points.buffer.data_ptr()
        assert torch.equal(seen[0], points.block("points"))
        torch.testing.assert_close(scores.a, points.x * 2)
        torch.testing.assert_close(scores.b, points.y * 2)
    with pytest.raises(BindingError, match="contiguous: Mlp has no input 'scores'"):
        mlp_module.Mlp(Spy(), contiguous=["scores"])


def test_close_releases_the_placed_model_and_a_later_call_places_it_again(  # type: ignore[no-untyped-def]
    mlp_module, tmp_path: Path
) -> None:
    points, scores = _points(mlp_module, 33), mlp_module.Scores.allocate(33)
    path = tmp_path / "linear.pt"
    torch.jit.save(torch.jit.script(Linear32()), str(path))
    loaded = mlp_module.Mlp.load(path)
    with loaded as model:
        assert model is loaded
        model(points, out=scores)
        first = scores.a.clone()
        placed = model._backend.on(torch.device("cpu"))  # the module loaded for the CPU
    assert loaded._backend.devices == ()
    scores.a.zero_()
    loaded(points, out=scores)  # loaded again from the file at this call
    assert loaded._backend.on(torch.device("cpu")) is not placed
    assert torch.equal(scores.a, first)


IN_PLACE_SCHEMA = """
layout Hits {
    column float32 x, y
}
model Rescale {
    input  xy = Hits{x, y} as [n, c]
    output x  = Hits{x}
}
"""


def test_a_writing_package_is_not_handed_an_output_over_its_inputs(tmp_path: Path) -> None:
    from soagen.runtime.backends import Backend, Runner

    (tmp_path / "rescale.soa").write_text(IN_PLACE_SCHEMA)
    generate_package(tmp_path / "rescale.soa", tmp_path, "pkg_in_place")
    module = import_generated(tmp_path, "pkg_in_place", "rescale")

    class Writing(Backend):
        """Stores its result into the output block it is given, as a --write-outputs package."""

        kind = "aot"
        records_autograd = False
        writes_outputs = True

        def place(self, device: torch.device) -> Runner:
            def run(tensors: object) -> object:
                xy, x = typing.cast(list[torch.Tensor], tensors)
                x.data.copy_(xy.sum(1))  # from C++ in a package: no version counter moves
                return []

            return run

    hits = module.Hits.allocate(100)
    hits.x.copy_(torch.arange(100.0))
    hits.y.fill_(1.0)
    model = module.Rescale(Writing("writes"))
    with pytest.raises(BindingError, match="output 'x' lies in the memory of input 'xy'"):
        model(hits, out=hits)
    assert torch.equal(hits.x, torch.arange(100.0))  # untouched
    other = module.Hits.allocate(100)
    model(hits, out=other)
    assert torch.equal(other.x, torch.arange(100.0) + 1)
    # Disjoint element ranges of one collection share no memory.
    model(hits[0:50], out=hits[50:100])
    assert torch.equal(hits.x[50:], torch.arange(50.0) + 1)

    # A model that returns its result may write over its input: the write-back comes after it.
    class Sum(nn.Module):
        def forward(self, xy: torch.Tensor) -> torch.Tensor:
            return xy.sum(1)

    before = hits.x.clone()
    module.Rescale(Sum())(hits, out=hits)
    assert torch.equal(hits.x, before + 1)


def test_bindings_may_share_names_with_model_attributes(
    generated_from_text: typing.Callable[[str], typing.Any],
) -> None:
    """Binding names are keys, never attributes: `run`, `close` and `index_bounds` clash with
    nothing, and the calls and checks that take binding names still find them."""
    module = generated_from_text(
        "layout Hits {\n    column float32 x, y\n    column int64 near\n}\n"
        "layout Out {\n    column float32 close\n}\n"
        "model M {\n"
        "    input run = Hits{x, y} as [n, c]\n"
        "    input index_bounds = Hits{near} indexes run\n"
        "    output close = Out{close}\n"
        "}\n"
    )

    class Model(nn.Module):
        def forward(self, points: torch.Tensor, near: torch.Tensor) -> torch.Tensor:
            return points[near].sum(dim=1)

    hits = module.Hits.allocate(5)
    hits.x.copy_(torch.arange(5.0))
    hits.y.fill_(1.0)
    hits.near.copy_(torch.tensor([4, 3, 2, 1, 0]))
    out = module.Out.allocate(5)
    model = module.M.load(Model(), contiguous={"run"})
    assert model.index_bounds == {"index_bounds": "run"}
    model(hits, out=out)
    assert out.close.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0]
    hits.near[0] = 5
    with pytest.raises(IndexRangeError, match=r"'index_bounds' .*outside \[0, 5\)"):
        model(hits, out=out)


def test_a_collection_of_another_layout_with_the_same_name_is_refused(
    generated_from_text: typing.Callable[[str], typing.Any],
) -> None:
    """Two schemas may both declare `Scores`: read or written with the other's geometry, a column
    the model does not own would be overwritten. Equal layouts from two schemas are accepted."""
    model_text = (
        "layout Hits {\n    column float32 x\n}\n"
        "layout Scores {\n    column float32 score\n}\n"
        "model M {\n    input x = Hits{x}\n    output score = Scores{score}\n}\n"
    )
    ours = generated_from_text(model_text)
    theirs = generated_from_text(
        "layout Scores {\n    column float32 keep_me\n    column float32 score\n}\n"
    )
    same = generated_from_text(model_text + "// the same layouts, in another module\n")

    class Model(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    model = ours.M(Model())
    hits = ours.Hits.allocate(8, zero=True)
    other = theirs.Scores.allocate(8, zero=True)
    with pytest.raises(BindingError, match=r"M.score binds Scores as .*, got a different layout"):
        model(hits, out=other)
    assert not other.buffer.any()  # nothing written
    out = same.Scores.allocate(8)
    model(same.Hits.allocate(8, zero=True), out=out)
    assert out.score.tolist() == [1.0] * 8


def test_out_of_a_model_with_several_output_layouts_is_checked(
    generated_from_text: typing.Callable[[str], typing.Any],
) -> None:
    # The input layout is named so that its parameter is `outputs`: no clash with the call's own.
    module = generated_from_text(
        "layout Outputs {\n    column float32 x\n}\n"
        "layout OutA {\n    column float32 a\n}\n"
        "layout OutB {\n    column float32 b\n}\n"
        "model M {\n    input x = Outputs{x}\n    output a = OutA{a}\n    output b = OutB{b}\n}\n"
    )

    class Model(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + 1, x * 2

    model = module.M(Model())
    points = module.Outputs.allocate(4)
    points.x.copy_(torch.arange(4.0))
    a, b = module.OutA.allocate(4, zero=True), module.OutB.allocate(4, zero=True)
    expected = r"M takes out=\(OutA, OutB\): one collection per output layout, in that order; got "
    for out, got in (
        (a, "OutA"),
        ((a,), r"\(OutA\)"),
        ((a, b, points), r"\(OutA, OutB, Outputs\)"),
    ):
        with pytest.raises(BindingError, match=expected + got):
            model(points, out=out)
    with pytest.raises(BindingError, match=r"M.a \(out=\) binds OutA, got OutB"):
        model(points, out=(b, a))
    assert not a.a.any() and not b.b.any()
    model(points, out=[a, b])
    assert a.a.tolist() == [1.0, 2.0, 3.0, 4.0] and b.b.tolist() == [0.0, 2.0, 4.0, 6.0]


class WritesFeatures(nn.Module):
    def forward(
        self, nodes: torch.Tensor, index: torch.Tensor, features: torch.Tensor
    ) -> torch.Tensor:
        features.mul_(2)
        return features[:, 0].clone()


def test_a_write_into_one_of_several_inputs_of_one_collection_names_that_input() -> None:
    """edge_index and edge_features are views of one Edges buffer; each is handed over with a
    version counter of its own, so a write into edge_features is pinned on it alone."""
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    nodes, edges = Nodes.allocate(4, zero=True), Edges.allocate(6, zero=True)
    with pytest.raises(InputModifiedError, match=r"wrote into its input 'edge_features' \("):
        EdgeClassifier(WritesFeatures())(nodes, edges, out=EdgeScores.allocate(6))


def test_inside_inference_mode_a_write_names_every_input_it_could_be() -> None:
    """Inside the caller's `torch.inference_mode()` new tensors keep no version counter, so the
    inputs are views sharing the buffer's: a write into edge_features is not blamed on
    edge_index alone."""
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    nodes, edges = Nodes.allocate(4, zero=True), Edges.allocate(6, zero=True)
    with (
        torch.inference_mode(),
        pytest.raises(
            InputModifiedError,
            match=r"one of its inputs 'edge_index' .*'edge_features' .*share a version counter",
        ),
    ):
        EdgeClassifier(WritesFeatures())(nodes, edges, out=EdgeScores.allocate(6))


def test_writes_by_another_thread_during_a_call_are_not_the_models() -> None:
    """A producer filling a member the model does not read, while the model runs on the same
    collection, moves the buffer's version counter but not those of the model's inputs."""
    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    net = build_model()
    entered, written = threading.Event(), threading.Event()

    class WaitsForTheProducer(nn.Module):
        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            entered.set()
            assert written.wait(10)
            return typing.cast(torch.Tensor, net(*inputs))

    def produce() -> None:
        assert entered.wait(10)
        nodes.detector_id.fill_(7)
        written.set()

    nodes, edges = Nodes.allocate(50, zero=True), Edges.allocate(80, zero=True)
    nodes.block("node_features").copy_(torch.randn(50, 4))
    scores = EdgeScores.allocate(80, zero=True)
    producer = threading.Thread(target=produce)
    producer.start()
    EdgeClassifier(WaitsForTheProducer())(nodes, edges, out=scores)
    producer.join()
    assert nodes.detector_id.eq(7).all()
    expected = EdgeScores.allocate(80)
    EdgeClassifier(net)(nodes, edges, out=expected)
    assert torch.equal(scores.score, expected.score) and scores.score.any()


class Neighbour(nn.Module):
    def forward(self, points: torch.Tensor, neighbour: torch.Tensor) -> torch.Tensor:
        return points[neighbour, :2] - points[:, :2]


def test_batch_size_refuses_index_inputs(mlp_module) -> None:  # type: ignore[no-untyped-def]
    """An index counts from the start of the whole collection: a slice would read another
    element than it names (or refuse a valid one), so nothing runs."""
    points = _points(mlp_module, 1000)
    points.label.copy_(torch.arange(1000).flip(0))
    scores = mlp_module.Scores.allocate(1000, zero=True)
    for bounds in (None, {"neighbour": None}):
        model = mlp_module.Neighbours(Neighbour(), index_bounds=bounds)
        with pytest.raises(
            BindingError, match=r"batch_size: in Neighbours, 'neighbour' indexes 'points'"
        ):
            model(points, out=scores, batch_size=100)
        assert not scores.a.any() and not scores.b.any()
        # Refused whatever the size, one slice too: a call site must not break on larger events.
        with pytest.raises(
            BindingError, match=r"batch_size: in Neighbours, 'neighbour' indexes 'points'"
        ):
            model(points, out=scores, batch_size=1000)
    model(points, out=scores)
    features = points.block("points")
    torch.testing.assert_close(scores.a, features[:, 0].flip(0) - features[:, 0])


def test_a_read_only_output_is_refused(mlp_module) -> None:  # type: ignore[no-untyped-def]
    """A collection wrapped read-only (torch views allowed for reading) takes no results."""
    import numpy as np

    from soagen.runtime import ReadOnlyCollectionError

    points = _points(mlp_module, 4)
    size = mlp_module.Scores.byte_size(4)
    raw = np.zeros(size + 128, dtype=np.uint8)
    start = -raw.ctypes.data % 128  # the layout's alignment
    memory = raw[start : start + size]
    memory.flags.writeable = False
    for unsafe_torch_views in (True, False):
        out = mlp_module.Scores.wrap(
            memory, 4, read_only=True, unsafe_torch_views=unsafe_torch_views
        )
        with pytest.raises(
            ReadOnlyCollectionError, match="output 'scores' is a Scores wrapped read-only"
        ):
            mlp_module.Mlp(Linear32())(points, out=out)
    assert not memory.any()


def test_inputs_of_memory_whose_storage_starts_off_the_item_size_are_read_in_place() -> None:
    """A buffer aligned for its layout inside memory whose storage starts at an odd address (a
    slice of a bytearray, say) is seen through typed views of a re-imported storage: the tensors a
    model gets must count their offsets from that storage, not the buffer's."""
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    class FirstNodeColumnOfEachSource(nn.Module):
        def forward(
            self, nodes: torch.Tensor, index: torch.Tensor, features: torch.Tensor
        ) -> torch.Tensor:
            return nodes[index[0], 0] + features[:, 0]

    n = 8
    memory = torch.frombuffer(bytearray(Nodes.byte_size(n) + 512), dtype=torch.uint8, offset=3)
    start = -memory.data_ptr() % Nodes.ALIGNMENT
    nodes = Nodes.wrap(memory[start : start + Nodes.byte_size(n)], n, exact=True)
    nodes.x.copy_(torch.arange(n) + 10.0)
    edges = Edges.allocate(n, zero=True)
    edges.src.copy_(torch.arange(n).flip(0))
    scores = EdgeScores.allocate(n)
    seen: list[int] = []

    class Records(FirstNodeColumnOfEachSource):
        def forward(
            self, nodes: torch.Tensor, index: torch.Tensor, features: torch.Tensor
        ) -> torch.Tensor:
            seen.append(nodes.data_ptr())
            return super().forward(nodes, index, features)

    EdgeClassifier(Records())(nodes, edges, out=scores)
    assert seen == [nodes.block("node_features").data_ptr()]
    assert scores.score.tolist() == (torch.arange(n).flip(0) + 10.0).tolist()
    edges.src[0] = n  # one past the nodes: the range check reads the real indices too
    with pytest.raises(IndexRangeError, match=r"values 0\.\.8"):
        EdgeClassifier(Records())(nodes, edges, out=scores)


SAME_N_SCHEMA = """
layout Particles {
    column float32 pt, eta, phi
}
layout Masks {
    column uint8[3] mask
}
layout Reco {
    column float32 reco_pt
}
model Masked {
    input particles = Particles{pt, eta, phi} as [n, c]
    input mask = Masks{mask} as [n, 3] same n as particles
    output reco = Reco{reco_pt} as [n]
}
"""


class MaskedSum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, particles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return (particles * (1 - mask.to(particles.dtype))).sum(1)


def test_inputs_declared_same_n_are_checked_before_the_model_runs(tmp_path: Path) -> None:
    (tmp_path / "masked.soa").write_text(SAME_N_SCHEMA)
    generate_package(tmp_path / "masked.soa", tmp_path, "pkg_same_n")
    module = import_generated(tmp_path, "pkg_same_n", "masked")
    assert module.Masked.binding("mask").same_n_as == "particles"
    net = MaskedSum()
    model = module.Masked(net)
    particles, reco = module.Particles.allocate(5), module.Reco.allocate(5, zero=True)
    particles.block("particles").copy_(torch.arange(15.0).reshape(5, 3))
    with pytest.raises(
        BindingError,
        match=r"input 'mask' \(Masks, n=4\) must hold as many elements as input 'particles' "
        r"\(Particles, n=5\): the schema declares `same n as particles`",
    ):
        model(particles, module.Masks.allocate(4, zero=True), out=reco)
    assert net.calls == 0 and not reco.reco_pt.any()
    mask = module.Masks.allocate(5, zero=True)
    mask.mask[:, 1] = 1
    model(particles, mask, out=reco)
    torch.testing.assert_close(reco.reco_pt, torch.tensor([2.0, 8.0, 14.0, 20.0, 26.0]))


def test_batch_size_refuses_a_model_whose_inputs_are_all_whole(mlp_module) -> None:  # type: ignore[no-untyped-def]
    model = mlp_module.AllWhole(Linear32())
    points, scores = _points(mlp_module, 40), mlp_module.Scores.allocate(40, zero=True)
    with pytest.raises(BindingError, match="every input of AllWhole is declared `whole`"):
        model(points, out=scores, batch_size=16)
    assert not scores.a.any()
    model(points, out=scores)
    torch.testing.assert_close(scores.a, Linear32()(points.block("points"))[:, 0].detach())
