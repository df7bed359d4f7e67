"""The ONNX Runtime backend on real ONNX files the tests export themselves (torch.onnx.export).

Every result is compared with ONNX Runtime running the same file on contiguous copies of the blocks
(`_ort_on_contiguous`), the path the backend replaces, at several element counts (0 and 1 included),
on slices of collections and at two alignments.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
onnxruntime = pytest.importorskip("onnxruntime")
numpy = pytest.importorskip("numpy")

import soagen.runtime.onnx as soagen_onnx  # noqa: E402
from soagen.runtime import (  # noqa: E402
    BindingError,
    CompiledModelMismatchError,
    IndexRangeError,
    ModelLoadError,
)
from tests.helpers import REPO, generate_package, import_generated  # noqa: E402

# Every kind of block the adaptation handles: columns in the declared order [c, n], an array
# column (coefficient-major rows), a packed array column, a scalar, outputs of one and of two rows.
SCHEMA = """
layout Hits {{
    align {align}
    column float32 x, y, z
    column float32[2, 3] cov
    column int16[10] adc packed
    scalar float32 scale
}}

layout Out {{
    align {align}
    column float32 score
    column float32[2] pair
}}

model ArrayNet {{
    input  points = Hits{{x, y, z}} as [c, n]
    input  cov    = Hits{{cov}}     as [n, 2, 3]
    input  adc    = Hits{{adc}}     as [n, 10]
    input  scale  = Hits{{scale}}   as [n, c]
    output score  = Out{{score}}    as [n]
    output pair   = Out{{pair}}     as [n, 2]
}}

model Doubler {{
    input  values  = Out{{score}} as [n]
    output doubled = Out{{score}} as [n]
}}
"""


class ArrayNet(torch.nn.Module):
    """Weights every value by its position, so that any value read from the wrong place shows."""

    def forward(self, points, cov, adc, scale):  # type: ignore[no-untyped-def]
        weights = torch.arange(1.0, 4.0)[:, None]
        cov_weights = torch.arange(1.0, 7.0).reshape(1, 2, 3)
        adc_weights = torch.arange(1.0, 11.0)
        score = (points * weights).sum(0) + (cov * cov_weights).sum((1, 2)) * scale[:, 0]
        score = score + (adc.float() * adc_weights).sum(1) / 100
        pair = torch.stack([points[0] * points[1], cov[:, 1, 2] - adc[:, 9].float()], dim=1)
        return score, pair


class Sums(torch.nn.Module):
    """ArrayNet's inputs and outputs, for any number of point rows."""

    def forward(self, points, cov, adc, scale):  # type: ignore[no-untyped-def]
        return points.sum(0) + adc.float().sum(1) * scale[:, 0], cov.sum(2)


class Doubler(torch.nn.Module):
    def forward(self, values):  # type: ignore[no-untyped-def]
        return values * 2


def export_legacy(
    net: torch.nn.Module,
    example: tuple[Any, ...],
    path: Path,
    inputs: list[str],
    outputs: list[str],
    dynamic: dict[str, dict[int, str]] | None,
) -> Path:
    """The legacy exporter: a fraction of a second per model where the dynamo one takes seconds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net.eval(),
            example,
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
        )
    return path


def export_gnn(net: torch.nn.Module, path: Path) -> Path:
    """The README's GNN as users export it: nodes and edges each with a dynamic count."""
    return export_legacy(
        net,
        (torch.randn(16, 4), torch.randint(0, 16, (2, 64)), torch.rand(64, 2)),
        path,
        ["node_features", "edge_index", "edge_features"],
        ["edge_scores"],
        {
            "node_features": {0: "nodes"},
            "edge_index": {1: "edges"},
            "edge_features": {0: "edges"},
            "edge_scores": {0: "edges"},
        },
    )


@pytest.fixture(scope="session")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[int, ModuleType]:
    """The schema generated at two alignments."""
    found = {}
    for align in (32, 256):
        folder = tmp_path_factory.mktemp(f"onnx{align}")
        (folder / "hits.soa").write_text(SCHEMA.format(align=align))
        generate_package(folder / "hits.soa", folder, f"pkg_onnx{align}")
        found[align] = import_generated(folder, f"pkg_onnx{align}", "hits")
    return found


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("onnx_files")
    n = {1: "n"}
    first = {0: "n"}
    example = (
        torch.randn(3, 5),
        torch.randn(5, 2, 3),
        torch.randint(0, 100, (5, 10)).to(torch.int16),
        torch.randn(5, 1),
    )
    names = ["points", "cov", "adc", "scale"]
    array = {"points": n, "cov": first, "adc": first, "scale": first}
    array |= {"score": first, "pair": first}
    found = {
        "array": export_legacy(
            ArrayNet(), example, folder / "array.onnx", names, ["score", "pair"], array
        ),
        # Positional names: matched to the schema by order.
        "array_positional": export_legacy(
            ArrayNet(),
            example,
            folder / "positional.onnx",
            ["a", "b", "c", "d"],
            ["o1", "o2"],
            {"a": n, "b": first, "c": first, "d": first, "o1": first, "o2": first},
        ),
        "fixed_batch": export_legacy(
            ArrayNet(), example, folder / "fixed.onnx", names, ["score", "pair"], None
        ),
        "wrong_width": export_legacy(
            Sums(),
            (torch.randn(4, 5), *example[1:]),
            folder / "wide.onnx",
            names,
            ["score", "pair"],
            array,
        ),
        "doubler": export_legacy(
            Doubler(),
            (torch.randn(5),),
            folder / "doubler.onnx",
            ["values"],
            ["doubled"],
            {"values": first, "doubled": first},
        ),
        "doubler_int": export_legacy(
            Doubler(),
            (torch.arange(5),),
            folder / "doubler_int.onnx",
            ["values"],
            ["doubled"],
            {"values": first, "doubled": first},
        ),
    }
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.gnn_model import build_model

    found["gnn"] = export_gnn(build_model(), folder / "gnn.onnx")
    return found


def _hits(module: ModuleType, n: int, seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed)
    hits = module.Hits.allocate(n)
    for member in ("x", "y", "z"):
        getattr(hits, member).copy_(torch.randn(n, generator=generator))
    hits.cov.copy_(torch.randn(n, 2, 3, generator=generator))
    hits.adc.copy_(torch.randint(0, 1000, (n, 10), generator=generator).to(torch.int16))
    hits.scale.fill_(1.5)
    return hits


def _ort_on_contiguous(path: Path, model: Any, collections: dict[str, Any]) -> list[Any]:
    """ONNX Runtime on contiguous copies of the blocks: the results to equal."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {}
    for port, spec in zip(session.get_inputs(), model.INPUTS, strict=True):
        feeds[port.name] = collections[spec.name].block(spec.block).contiguous().numpy()
    return [torch.from_numpy(result) for result in session.run(None, feeds)]


@pytest.mark.parametrize("align", [32, 256])
def test_array_packed_and_scalar_blocks_equal_ort_on_contiguous_copies(
    modules: dict[int, ModuleType], files: dict[str, Path], align: int
) -> None:
    module = modules[align]
    for name, mode in (("array", "in_place"), ("array", "staged"), ("array_positional", "staged")):
        model = module.ArrayNet.load(files[name], backend_options={"outputs": mode})
        assert model.backend == "onnxruntime"
        for n in (0, 1, 5, 130):
            hits = _hits(module, n, seed=n)
            out = module.Out.allocate(n, zero=True)
            before = hits.buffer.clone()
            address = out.buffer.data_ptr()
            model(hits, out=out)
            assert torch.equal(hits.buffer, before)  # inputs untouched
            assert out.buffer.data_ptr() == address
            if n:
                score, pair = _ort_on_contiguous(files["array"], model, _bound(model, hits))
                torch.testing.assert_close(out.score, score, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(out.pair, pair, rtol=1e-5, atol=1e-5)
    # Slices: in the middle, and at the buffer's end (whose rows are bound from before the slice).
    hits = _hits(module, 200, seed=7)
    out = module.Out.allocate(200, zero=True)
    for start, stop in ((3, 90), (150, 200), (199, 200)):
        model(hits.slice(start, stop), out=out.slice(start, stop))
        score, pair = _ort_on_contiguous(
            files["array"], model, _bound(model, hits.slice(start, stop))
        )
        torch.testing.assert_close(out.score[start:stop], score, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.pair[start:stop], pair, rtol=1e-5, atol=1e-5)
    # Outputs are written row by row: the elements around a slice keep their values.
    model = module.ArrayNet.load(files["array"], backend_options={"outputs": "in_place"})
    out = module.Out.allocate(200, zero=True)
    model(hits.slice(40, 60), out=out.slice(40, 60))
    assert not out.score[:40].any() and not out.score[60:].any() and out.score[40:60].all()
    assert not out.pair[:40].any() and not out.pair[60:].any()


def _bound(model: Any, hits: Any) -> dict[str, Any]:
    return {spec.name: hits for spec in model.INPUTS}


def test_batch_size_and_staged_outputs_equal_in_place(
    modules: dict[int, ModuleType], files: dict[str, Path]
) -> None:
    module = modules[32]
    hits = _hits(module, 300, seed=3)
    in_place = module.ArrayNet.load(files["array"], backend_options={"outputs": "in_place"})
    staged = module.ArrayNet.load(files["array"])
    whole, batched, via_stage = (module.Out.allocate(300, zero=True) for _ in range(3))
    in_place(hits, out=whole)
    in_place(hits, out=batched, batch_size=64)
    staged(hits, out=via_stage)
    torch.testing.assert_close(batched.buffer, whole.buffer, rtol=0, atol=0)
    torch.testing.assert_close(via_stage.buffer, whole.buffer, rtol=0, atol=0)


def test_the_readme_gnn_equals_ort_and_eager(
    modules: dict[int, ModuleType], files: dict[str, Path]
) -> None:
    from examples.gnn_model import build_model, fill_examples
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes

    model = EdgeClassifier.load(files["gnn"])
    net = build_model()
    for nodes_n, edges_n in ((1, 1), (40, 0), (100, 700)):
        nodes, edges = Nodes.allocate(nodes_n), Edges.allocate(edges_n)
        fill_examples({"Nodes": nodes, "Edges": edges})
        scores = EdgeScores.allocate(edges_n, zero=True)
        model(nodes, edges, out=scores)
        if not edges_n:
            continue
        collections = {"node_features": nodes, "edge_index": edges, "edge_features": edges}
        (want,) = _ort_on_contiguous(files["gnn"], model, collections)
        torch.testing.assert_close(scores.score, want, rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            eager = net(
                *(
                    c.block(s.block).contiguous()
                    for c, s in zip(collections.values(), model.INPUTS, strict=True)
                )
            )
        torch.testing.assert_close(scores.score, eager, rtol=1e-4, atol=1e-5)
        bad = edges.src[0].item()
        edges.src[0] = nodes_n
        with pytest.raises(IndexRangeError):
            model(nodes, edges, out=scores)
        edges.src[0] = bad


def _renamed_output_axis(path: Path, target: Path) -> Path:
    """The file with its first output's first dimension named by a symbol no input has."""
    import onnx

    model = onnx.load(str(path))
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "scores_of_its_own"
    onnx.save(model, str(target))
    return target


@pytest.fixture(scope="session")
def compiled_gnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example GNN exported by `soagen compile -o gnn.onnx`, once per session."""
    from soagen.build.onnx_export import export_onnx

    examples = REPO / "examples" / "gnn_model.py"
    return export_onnx(
        REPO / "schemas" / "gnn.soa",
        "EdgeClassifier",
        f"{examples}:build_model",
        output=tmp_path_factory.mktemp("onnx_gnn") / "gnn.onnx",
        examples=f"{examples}:fill_examples",
    )


def test_an_onnx_model_is_served_into_output_collections_the_server_allocates(
    files: dict[str, Path], compiled_gnn: Path, tmp_path: Path
) -> None:
    """`soagen serve --model-file gnn.onnx`'s function for each event, in this process: ONNX
    Runtime writes into output blocks, so the server allocates EdgeScores per event: as many as
    `--output-size` says, else as the file's axis names suggest (edge_scores' is named as
    edge_index's); a file `soagen compile` wrote records what the eager model gave, and a size
    that differs is refused. Each answers what a local call writes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.gnn_model import fill_examples
    from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes
    from soagen.serving.errors import ServeError
    from soagen.serving.server import EventRunner
    from soagen.serving.wire import ERROR_OUTPUT, wire_tensor

    served = EdgeClassifier.load(files["gnn"])
    assert served._backend.suggested_output_counts == {"edge_scores": "edge_index"}
    assert served._backend.output_counts == {}
    layouts = {"Nodes": Nodes, "Edges": Edges, "EdgeScores": EdgeScores}
    # The file's names are a guess that a size given overrides.
    EventRunner(served, layouts, "cpu", {"edge_scores": "node_features"})
    unnamed = EdgeClassifier.load(_renamed_output_axis(files["gnn"], tmp_path / "own.onnx"))
    assert unnamed._backend.suggested_output_counts == {}
    with pytest.raises(ServeError, match="give --output-size edge_scores=INPUT"):
        EventRunner(unnamed, layouts, "cpu")
    EventRunner(unnamed, layouts, "cpu", {"edge_scores": "edge_index"})
    # What the export measured against the eager model is fixed: a size that differs is refused.
    compiled = EdgeClassifier.load(compiled_gnn)
    assert compiled._backend.output_counts == {"edge_scores": "edge_index"}
    with pytest.raises(
        ServeError,
        match=r"output 'edge_scores' would get as many elements as 'node_features' per event, "
        r"and the model file was exported with as many elements as 'edge_index' \(",
    ):
        EventRunner(compiled, layouts, "cpu", {"edge_scores": "node_features"})
    # Another input of the same collection is the same count.
    EventRunner(compiled, layouts, "cpu", {"edge_scores": "edge_features"})
    for path, runner in (
        (files["gnn"], EventRunner(served, layouts, "cpu")),
        (compiled_gnn, EventRunner(compiled, layouts, "cpu")),
    ):
        local = EdgeClassifier.load(path)
        for nodes_n, edges_n in ((1, 1), (100, 700)):
            nodes, edges = Nodes.allocate(nodes_n), Edges.allocate(edges_n)
            fill_examples({"Nodes": nodes, "Edges": edges})
            data = {}
            for spec, collection in zip(served.INPUTS, (nodes, edges, edges), strict=True):
                wire = wire_tensor(spec)
                data[wire.name] = collection.block(spec.block).permute(wire.order).contiguous()
                data[wire.name] = data[wire.name].numpy()[None]
            (answer,) = runner([type("Request", (), {"data": data})()])
            assert answer[ERROR_OUTPUT].tolist() == [[b""]]
            want = EdgeScores.allocate(edges_n, zero=True)
            local(nodes, edges, out=want)
            assert torch.equal(torch.from_numpy(answer["edge_scores"][0]), want.score)


def test_calls_on_the_same_blocks_reuse_their_binding(
    modules: dict[int, ModuleType], files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A binding holds addresses: calls on the same blocks run the one made for them, see the
    values written there since, and any other geometry (a slice, another buffer, another
    thread) gets its own."""
    import threading

    made: list[int] = []
    real = onnxruntime.InferenceSession.io_binding

    def counted(session: Any) -> Any:
        made.append(threading.get_ident())
        return real(session)

    monkeypatch.setattr(onnxruntime.InferenceSession, "io_binding", counted)
    module = modules[32]
    for mode in soagen_onnx.OUTPUT_MODES:
        model = module.ArrayNet.load(files["array"], backend_options={"outputs": mode})
        hits, out = _hits(module, 50, seed=1), module.Out.allocate(50)
        model(hits, out=out)  # its binding, and the first call's check on the original model
        made.clear()
        for seed in (2, 3):
            hits.buffer.copy_(_hits(module, 50, seed=seed).buffer)
            model(hits, out=out)
            (score, pair) = _ort_on_contiguous(files["array"], model, _bound(model, hits))
            torch.testing.assert_close(out.score, score, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out.pair, pair, rtol=1e-5, atol=1e-5)
        assert made == []
        # More geometries than a thread keeps: the oldest are made again, results stay right.
        geometries = [(start, 50) for start in range(2, 22, 2)]
        for start, stop in geometries * 2:
            model(hits.slice(start, stop), out=out.slice(start, stop))
        assert len(made) == 2 * len(geometries)
        (score, pair) = _ort_on_contiguous(files["array"], model, _bound(model, hits))
        torch.testing.assert_close(out.score, score, rtol=1e-5, atol=1e-5)
        # Another thread binds the same blocks for itself.
        made.clear()
        worker = threading.Thread(target=model, args=(hits,), kwargs={"out": out})
        worker.start()
        worker.join()
        assert len(made) == 1 and made[0] != threading.get_ident()
    # Staged outputs over the size limit keep no scratch between calls: each call binds anew.
    monkeypatch.setattr(soagen_onnx, "_PLAN_SCRATCH_BYTES", 0)
    model = module.ArrayNet.load(files["array"])
    model(hits, out=out)
    made.clear()
    model(hits, out=out)
    model(hits, out=out)
    assert len(made) == 2


def test_no_copy_on_the_call_path(modules: dict[int, ModuleType], files: dict[str, Path]) -> None:
    """ONNX Runtime reads the blocks and writes the output rows at the buffers' own addresses:
    torch copies nothing during the call."""
    module = modules[32]
    model = module.ArrayNet.load(files["array"], backend_options={"outputs": "in_place"})
    hits, out = _hits(module, 1000, seed=1), module.Out.allocate(1000)
    model(hits, out=out)  # the first call also runs the check against the original model
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        model(hits, out=out)
    names = {event.name for event in profile.events()}
    assert not {"aten::copy_", "aten::clone", "aten::contiguous"} & names, names
    # The probe sees copies where there are: staged outputs take one per output.
    staged = module.ArrayNet.load(files["array"])
    staged(hits, out=out)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        staged(hits, out=out)
    assert "aten::copy_" in {event.name for event in profile.events()}


def test_mismatched_models_are_refused_naming_both_sides(
    modules: dict[int, ModuleType], files: dict[str, Path]
) -> None:
    module = modules[32]
    with pytest.raises(ModelLoadError, match="fixed batch size 5") as fixed:
        module.ArrayNet.load(files["fixed_batch"])
    assert "the schema: inputs points float32 [3, n]" in str(fixed.value)
    with pytest.raises(ModelLoadError, match=r"has 4 in dimension 0, the block 3") as wide:
        module.ArrayNet.load(files["wrong_width"])
    assert "the ONNX model: inputs points float32 [4, n]" in str(wide.value)
    with pytest.raises(ModelLoadError, match="it has 3 input"):
        module.ArrayNet.load(files["gnn"])
    with pytest.raises(ModelLoadError, match="holds int64, the block float32"):
        module.Doubler.load(files["doubler_int"])
    with pytest.raises(ModelLoadError, match="it cannot run with backend='aot'"):
        module.ArrayNet.load(files["array"], backend="aot")
    with pytest.raises(ModelLoadError, match="backend_options are for ONNX models"):
        module.Doubler(Doubler(), backend_options={"outputs": "staged"})
    with pytest.raises(ModelLoadError, match="outputs must be one of in_place, staged"):
        module.ArrayNet.load(files["array"], backend_options={"outputs": "later"})
    with pytest.raises(ModelLoadError, match="SessionOptions has no 'threads'"):
        module.ArrayNet.load(files["array"], backend_options={"session_options": {"threads": 2}})


def test_the_file_kind_comes_from_the_content(
    modules: dict[int, ModuleType], files: dict[str, Path], tmp_path: Path
) -> None:
    renamed = tmp_path / "model.pt"
    renamed.write_bytes(files["doubler"].read_bytes())
    model = modules[32].Doubler.load(renamed)
    assert model.backend == "onnxruntime"
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07not a model")
    with pytest.raises(ModelLoadError, match="is not an ONNX model"):
        modules[32].Doubler.load(tmp_path / "junk.onnx")


def test_outputs_over_their_inputs_are_refused_in_place_and_staged_otherwise(
    modules: dict[int, ModuleType], files: dict[str, Path]
) -> None:
    module = modules[32]
    out = module.Out.allocate(50)
    out.score.copy_(torch.arange(50.0))
    with pytest.raises(BindingError, match="backend_options=\\{'outputs': 'staged'\\}"):
        module.Doubler.load(files["doubler"], backend_options={"outputs": "in_place"})(out, out=out)
    module.Doubler.load(files["doubler"])(out, out=out)
    torch.testing.assert_close(out.score, torch.arange(50.0) * 2)


def test_session_settings_are_per_session(
    modules: dict[int, ModuleType], files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    made = []
    real = onnxruntime.InferenceSession

    def record(model: Any, options: Any, providers: Any) -> Any:
        made.append((options.intra_op_num_threads, options.inter_op_num_threads, providers))
        return real(model, options, providers=providers)

    monkeypatch.setattr(onnxruntime, "InferenceSession", record)
    module = modules[32]
    out = module.Out.allocate(4)
    module.Doubler.load(files["doubler"])(out, out=module.Out.allocate(4))
    module.Doubler.load(
        files["doubler"], backend_options={"session_options": {"intra_op_num_threads": 2}}
    )(out, out=module.Out.allocate(4))
    # The adapted model's session, then the original's for the first call's check.
    assert made[0] == (1, 1, ["CPUExecutionProvider"]) and made[1][:2] == (1, 1)
    assert made[2][:2] == (2, 1)


def test_a_wrong_adaptation_is_caught_by_the_first_call(
    modules: dict[int, ModuleType], files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test double of the adapter that swaps two input columns: the comparison with the original
    model raises, and the output blocks keep what they held."""
    real = soagen_onnx.adapt

    def swapping(model: Any, *args: Any) -> Any:
        return swap_points_rows(real(model, *args))

    monkeypatch.setattr(soagen_onnx, "adapt", swapping)
    monkeypatch.setattr(soagen_onnx, "_adapted_cache", {})
    module = modules[256]
    model = module.ArrayNet.load(files["array"], backend_options={"outputs": "in_place"})
    hits, out = _hits(module, 20, seed=2), module.Out.allocate(20)
    out.buffer.fill_(7)
    held = out.buffer.clone()
    with pytest.raises(CompiledModelMismatchError, match="disagrees with the original model"):
        model(hits, out=out)
    assert torch.equal(out.buffer, held)


def swap_points_rows(adapted: Any, points: str = "points") -> Any:
    """An adapted graph made wrong on purpose: the first two of the `points` input's three rows
    swapped where the adaptation hands them to the model."""
    from onnx import helper

    for position, node in enumerate(adapted.graph.node):
        if node.output[0] == points:
            if node.op_type == "Transpose":
                raise AssertionError(f"{points} is bound as [c, n]: no transpose expected")
            node.output[0] = f"soagen.{points}.unswapped"
            adapted.graph.initializer.append(helper.make_tensor("soagen.swap", 7, [3], [1, 0, 2]))
            gather = helper.make_node(
                "Gather", [f"soagen.{points}.unswapped", "soagen.swap"], [points], axis=0
            )
            adapted.graph.node.insert(position + 1, gather)
            return adapted
    raise AssertionError(f"no node produced {points}")


def test_missing_packages_name_the_extra(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Path], modules: dict[int, ModuleType]
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ModelLoadError, match=r"pip install 'soagen\[onnx\]'"):
        modules[32].Doubler.load(files["doubler"])


@pytest.mark.skipif(
    not torch.cuda.is_available()
    or "CUDAExecutionProvider" not in onnxruntime.get_available_providers(),
    reason="needs a GPU and onnxruntime-gpu",
)
def test_cuda_collections_run_on_the_callers_stream(
    modules: dict[int, ModuleType], files: dict[str, Path]
) -> None:
    module = modules[32]
    model = module.ArrayNet.load(files["array"])
    hits = _hits(module, 300, seed=5)
    on_host = module.Out.allocate(300)
    model(hits, out=on_host)
    gpu_hits, gpu_out = hits.to("cuda"), module.Out.allocate(300, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    model(gpu_hits, out=gpu_out, stream=stream)
    stream.synchronize()
    torch.testing.assert_close(gpu_out.buffer.cpu(), on_host.buffer, rtol=1e-5, atol=1e-5)


# --- soagen compile -o FILE.onnx: files whose inputs take the blocks' storage -----------------

FACTORY = """
import torch


class ArrayNet(torch.nn.Module):
    def forward(self, points, cov, adc, scale):
        weights = torch.arange(1.0, 4.0)[:, None]
        cov_weights = torch.arange(1.0, 7.0).reshape(1, 2, 3)
        score = (points * weights).sum(0) + (cov * cov_weights).sum((1, 2)) * scale[:, 0]
        score = score + (adc.float() * torch.arange(1.0, 11.0)).sum(1) / 100
        pair = torch.stack([points[0] * points[1], cov[:, 1, 2] - adc[:, 9].float()], dim=1)
        return score, pair


class ExportsOtherwise(ArrayNet):
    # A model whose exported graph is not what it computes eagerly: the export check's double.
    def forward(self, points, cov, adc, scale):
        score, pair = super().forward(points, cov, adc, scale)
        if torch.onnx.is_in_onnx_export():
            score = score + 1e-2
        return score, pair


def build():
    return ArrayNet()


def build_wrong():
    return ExportsOtherwise()
"""


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ArrayNet exported by `soagen compile -o array.onnx`, once per session."""
    from tests.helpers import run_cli

    folder = tmp_path_factory.mktemp("onnx_compiled")
    (folder / "hits.soa").write_text(SCHEMA.format(align=32))
    (folder / "factory.py").write_text(FACTORY)
    target = folder / "array.onnx"
    status, _, stderr = run_cli(
        "compile",
        str(folder / "hits.soa"),
        "--model",
        "ArrayNet",
        "--factory",
        f"{folder / 'factory.py'}:build",
        "-o",
        str(target),
    )
    assert status == 0, stderr
    return {"array": target, "folder": folder}


def test_a_compiled_file_takes_the_storage_and_equals_eager(
    modules: dict[int, ModuleType], compiled: dict[str, Path]
) -> None:
    import onnx

    module = modules[32]
    graph = onnx.load(str(compiled["array"])).graph
    assert {value.name for value in graph.input} == {
        *(
            name
            for spec in module.ArrayNet.INPUTS
            for name in soagen_onnx.range_inputs(soagen_onnx.block_storage(spec))
        ),
        *(f"soagen.{spec.name}" for spec in module.ArrayNet.INPUTS),
    }
    eager = ArrayNet()
    for mode in soagen_onnx.OUTPUT_MODES:
        model = module.ArrayNet.load(compiled["array"], backend_options={"outputs": mode})
        assert model._backend.storage_inputs and model._backend._original is None
        # Measured on the eager model at export: Out gets as many elements as Hits.
        assert model._backend.output_counts == {"score": "points", "pair": "points"}
        for n in (0, 1, 5, 130):
            hits = _hits(module, n, seed=n)
            out = module.Out.allocate(n, zero=True)
            model(hits, out=out)
            with torch.no_grad():
                score, pair = eager(
                    *(hits.block(spec.block).contiguous() for spec in module.ArrayNet.INPUTS)
                )
            torch.testing.assert_close(out.score, score, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(out.pair, pair, rtol=1e-5, atol=1e-4)
        hits = _hits(module, 200, seed=9)
        out = module.Out.allocate(200, zero=True)
        model(hits.slice(150, 200), out=out.slice(150, 200))
        with torch.no_grad():
            score, _ = eager(
                *(
                    hits.slice(150, 200).block(spec.block).contiguous()
                    for spec in module.ArrayNet.INPUTS
                )
            )
        torch.testing.assert_close(out.score[150:], score, rtol=1e-5, atol=1e-4)


TIED_SCHEMA = """
layout A {
    column float32 x
}

layout B {
    column float32 y, z
}

model Tied {
    input  a = A{x}
    input  b = B{y} same n as a
    output o = B{z}
}
"""


def test_output_counts_are_what_the_eager_model_gave_at_every_trial(
    modules: dict[int, ModuleType], tmp_path: Path
) -> None:
    from soagen.build.model import Trial
    from soagen.build.onnx_export import measured_output_counts

    binding = modules[32].ArrayNet

    def trials(*rows: tuple[int, int, int]) -> list[Trial]:
        # (Hits' count, score's count, pair's count) per trial.
        return [
            Trial({"Hits": hits}, [], (torch.empty(score), torch.empty(pair, 2)))
            for hits, score, pair in rows
        ]

    # The first input of Hits; a count that stayed 4 may be the trials' data (a selection).
    assert measured_output_counts(binding, trials((7, 7, 4), (12, 12, 4))) == {"score": "points"}
    # A count that follows nothing (2n), and a single trial, which cannot tell.
    assert measured_output_counts(binding, trials((7, 14, 7), (12, 24, 12))) == {"pair": "points"}
    assert measured_output_counts(binding, trials((7, 7, 7))) == {}
    # Layouts a `same n as` ties hold one count at every trial: the output's own layout's input
    # names it, which is what a server gives that collection.
    (tmp_path / "tied.soa").write_text(TIED_SCHEMA)
    generate_package(tmp_path / "tied.soa", tmp_path, "pkg_tied")
    tied = import_generated(tmp_path, "pkg_tied", "tied").Tied
    same = [Trial({"A": n, "B": n}, [], (torch.empty(n),)) for n in (7, 12)]
    assert measured_output_counts(tied, same) == {"o": "b"}


@pytest.mark.parametrize(
    ("recorded", "message"),
    [
        ({"scores": "points"}, r"names 'scores', no output of ArrayNet \(score, pair\)"),
        ({"score": "0"}, r"gives output 'score' '0', neither an input of ArrayNet \(points, "),
        ({"score": 5}, r"gives output 'score' 5, neither"),
        (["score"], r"is not a mapping"),
    ],
)
def test_a_compiled_file_with_unreadable_output_counts_is_refused(
    modules: dict[int, ModuleType],
    compiled: dict[str, Path],
    tmp_path: Path,
    recorded: object,
    message: str,
) -> None:
    import json

    import onnx

    model = onnx.load(str(compiled["array"]))
    (entry,) = [p for p in model.metadata_props if p.key == soagen_onnx.METADATA_KEY]
    entry.value = json.dumps({**json.loads(entry.value), "output_counts": recorded})
    onnx.save(model, str(tmp_path / "edited.onnx"))
    with pytest.raises(
        ModelLoadError, match=rf"edited\.onnx: its 'soagen' metadata's 'output_counts' {message}"
    ):
        modules[32].ArrayNet.load(tmp_path / "edited.onnx")


def test_a_compiled_file_refuses_another_binding(
    modules: dict[int, ModuleType], compiled: dict[str, Path]
) -> None:
    with pytest.raises(ModelLoadError, match="exported by soagen compile for another binding"):
        modules[256].ArrayNet.load(compiled["array"])  # its rows lie at another alignment


def test_an_export_that_disagrees_with_eager_writes_nothing(compiled: dict[str, Path]) -> None:
    from soagen.build.errors import CommandError
    from soagen.build.onnx_export import export_onnx

    folder = compiled["folder"]
    target = folder / "wrong.onnx"
    with pytest.raises(CommandError, match="disagrees with the eager model on output 'score'"):
        export_onnx(
            folder / "hits.soa", "ArrayNet", f"{folder / 'factory.py'}:build_wrong", output=target
        )
    assert not target.exists()
    assert not list(folder.glob(".wrong.*"))


def test_eager_trials_keep_results_a_model_returns_from_its_own_state(
    modules: dict[int, ModuleType],
) -> None:
    from soagen.build.model import SchemaOrder, eager_trials

    class Reused(torch.nn.Module):
        """Returns a view of one buffer it writes every call."""

        def __init__(self) -> None:
            super().__init__()
            self.held = torch.zeros(4096)

        def forward(self, values: torch.Tensor) -> torch.Tensor:
            result = self.held[: values.shape[0]]
            torch.mul(values, 2, out=result)
            return result

    module = modules[32]
    reused = SchemaOrder(Reused(), module.Doubler)
    trials = eager_trials(
        module.Doubler, {"Out": module.Out}, reused, {"Out": 40}, {}, torch.device("cpu"), None
    )
    assert len(trials) > 2
    for trial in trials:
        assert torch.equal(trial.expected[0], trial.inputs[0] * 2)


def test_an_export_whose_file_does_not_load_writes_nothing(
    compiled: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from soagen.build.errors import CommandError
    from soagen.build.onnx_export import export_onnx

    def unreadable(exported: object, binding: object, source: str) -> dict[str, str]:
        raise ModelLoadError(f"{source}: unreadable")

    monkeypatch.setattr(soagen_onnx, "recorded_output_counts", unreadable)
    folder = compiled["folder"]
    target = folder / "unread.onnx"
    with pytest.raises(CommandError, match=r"the ONNX file written does not load: .*: unreadable"):
        export_onnx(
            folder / "hits.soa", "ArrayNet", f"{folder / 'factory.py'}:build", output=target
        )
    assert not target.exists()
    assert not list(folder.glob(".unread.*"))


def test_an_export_whose_output_counts_read_back_otherwise_writes_nothing(
    compiled: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from soagen.build.errors import CommandError
    from soagen.build.onnx_export import export_onnx

    # A reader that loses a count: the file would size a server's outputs otherwise.
    monkeypatch.setattr(soagen_onnx, "recorded_output_counts", lambda exported, binding, source: {})
    folder = compiled["folder"]
    target = folder / "lost.onnx"
    with pytest.raises(
        CommandError,
        match=r"lost\.[0-9a-f]+\.onnx reads back output counts \{\}, written as "
        r"\{'score': 'points', 'pair': 'points'\}",
    ):
        export_onnx(
            folder / "hits.soa", "ArrayNet", f"{folder / 'factory.py'}:build", output=target
        )
    assert not target.exists()
    assert not list(folder.glob(".lost.*"))
