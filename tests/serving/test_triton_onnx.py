"""`soagen triton --backend onnxruntime`: entries for Triton's onnxruntime backend.

The tritonserver PyTriton bundles has the Python backend only (no onnxruntime backend library), so
no test serves these entries. What Triton would do is done here for real instead: config.pbtxt is
parsed with Triton's own ModelConfig message and checked field by field and against model.onnx's
inputs and outputs (what the onnxruntime backend checks at load), and model.onnx is run by ONNX
Runtime on the tensors soagen's client sends (its own encoding of collections, batch axis of 1,
C order as Triton hands them on), its answers decoded by the client's own decoding, against the
original model run by ONNX Runtime on contiguous copies of the same blocks: several n (0 and 1
included), slices at the buffer's end, two alignments, packed and array columns and a scalar.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
onnxruntime = pytest.importorskip("onnxruntime")
numpy = pytest.importorskip("numpy")
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

from google.protobuf import json_format, text_format  # noqa: E402

import soagen.serving.onnx_entry as onnx_entry  # noqa: E402
from soagen.dsl.loader import load  # noqa: E402
from soagen.serving.client import _declared_tensor, _host_array, _served, _wire_source  # noqa: E402
from soagen.serving.model_config import Options, TritonError, build_config  # noqa: E402
from soagen.serving.repository import Request, write_model  # noqa: E402
from tests.helpers import REPO, generate_package, import_generated, run_cli  # noqa: E402

# The runtime's ONNX tests' blocks: columns read [c, n], an array column, a packed array column
# (whose wire order differs from its storage order), a scalar (one value per event on the wire).
from tests.runtime.test_onnx import (  # noqa: E402
    SCHEMA,
    ArrayNet,
    Sums,
    export_gnn,
    export_legacy,
    swap_points_rows,
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The schema at two alignments, its generated modules, the ONNX files and their entries."""
    root = tmp_path_factory.mktemp("triton_onnx")
    n, first = {1: "n"}, {0: "n"}
    names = ["points", "cov", "adc", "scale"]
    dynamic = {"points": n, "cov": first, "adc": first, "scale": first}
    dynamic |= {"score": first, "pair": first}
    example = (
        torch.randn(3, 5),
        torch.randn(5, 2, 3),
        torch.randint(0, 100, (5, 10)).to(torch.int16),
        torch.randn(5, 1),
    )
    found: dict[str, Any] = {"root": root}
    found["array"] = export_legacy(ArrayNet(), example, root / "array.onnx", names, ["score", "pair"], dynamic)  # fmt: skip
    wide = (torch.randn(4, 5), *example[1:])
    found["wide"] = export_legacy(
        Sums(), wide, root / "wide.onnx", names, ["score", "pair"], dynamic
    )
    for align in (32, 256):
        schema = root / f"hits{align}.soa"
        schema.write_text(SCHEMA.format(align=align))
        generate_package(schema, root, f"pkg_triton_onnx{align}")
        found[align] = import_generated(root, f"pkg_triton_onnx{align}", f"hits{align}")
        request = Request(
            schema=schema,
            model="ArrayNet",
            repository=root / f"repository{align}",
            backend="onnxruntime",
            package=found["array"],
        )
        found[f"entry{align}"] = write_model(request)
    return found


def _config(folder: Path) -> Any:
    """config.pbtxt as Triton reads it: its own ModelConfig message (unknown fields fail)."""
    return text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def _hits(module: ModuleType, n: int, seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed)
    hits = module.Hits.allocate(n)
    for member in ("x", "y", "z"):
        getattr(hits, member).copy_(torch.randn(n, generator=generator))
    hits.cov.copy_(torch.randn(n, 2, 3, generator=generator))
    hits.adc.copy_(torch.randint(0, 1000, (n, 10), generator=generator).to(torch.int16))
    hits.scale.fill_(1.5)
    return hits


def _served_wires(module: ModuleType, config: Any) -> tuple[list[Any], list[Any]]:
    """The wire tensors soagen's client settles on after reading `config` (`_configure`)."""
    answer = json_format.MessageToDict(config, preserving_proto_field_name=True)
    entries = {entry["name"]: entry for entry in (*answer["input"], *answer["output"])}
    batched = config.max_batch_size > 0
    model = module.ArrayNet
    wires = []
    for specs in (model.INPUTS, model.OUTPUTS):
        wires.append(
            [
                _served("ArrayNet", "test", onnx_entry.wire_tensor(s), entries, batched)
                for s in specs
            ]
        )
    return wires[0], wires[1]


def _through_entry(session: Any, module: ModuleType, config: Any, hits: Any) -> list[Any]:
    """What a client reads back from the entry for `hits`: the request's tensors encoded and the
    response decoded by soagen's client, model.onnx run by ONNX Runtime in between."""
    inputs, outputs = _served_wires(module, config)
    feeds = {}
    for spec, wire in zip(module.ArrayNet.INPUTS, inputs, strict=True):
        host, _ = _host_array(_wire_source(hits, spec.block, wire), wire)
        feeds[wire.name] = numpy.ascontiguousarray(host[None] if wire.batched else host)
    answers = session.run([wire.name for wire in outputs], feeds)
    results = []
    for spec, wire, answer in zip(module.ArrayNet.OUTPUTS, outputs, answers, strict=True):
        n = hits.size
        declared = tuple(n if axis == "n" else 2 for axis in spec.block.axes)
        assert tuple(answer.shape) == wire.wire_shape(declared)  # what the client checks
        results.append(_declared_tensor(answer[0] if wire.batched else answer, wire))
    return results


def _original(path: Path, module: ModuleType, hits: Any) -> list[Any]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {
        spec.name: hits.block(spec.block).contiguous().numpy() for spec in module.ArrayNet.INPUTS
    }
    return [torch.from_numpy(value) for value in session.run(["score", "pair"], feeds)]


def test_the_config_is_triton_s_and_fits_model_onnx(made: dict[str, Any]) -> None:
    written = made["entry32"]
    assert sorted(written.files) == ["1/model.onnx", "config.pbtxt"]
    config = _config(written.folder)
    assert (config.name, config.backend, config.max_batch_size) == ("ArrayNet", "onnxruntime", 1)
    assert config.default_model_filename == "model.onnx"
    assert not config.HasField("dynamic_batching")
    assert [(g.kind, g.count) for g in config.instance_group] == [(config.instance_group[0].KIND_CPU, 1)]  # fmt: skip
    assert {key: value.string_value for key, value in config.parameters.items()} == {
        "intra_op_thread_count": "1",
        "inter_op_thread_count": "1",
    }
    fp32 = model_config_pb2.TYPE_FP32
    expected_inputs = [
        ("points", fp32, [3, -1]),
        ("cov", fp32, [3, 2, -1]),  # coefficient-major rows, as stored
        ("adc", model_config_pb2.TYPE_INT16, [10, -1]),  # packed: n last on the wire
        ("scale", fp32, [1, 1]),  # scalars: one value per event
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == expected_inputs
    assert not any(t.allow_ragged_batch for t in config.input)
    expected_outputs = [("score", fp32, [-1]), ("pair", fp32, [2, -1])]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == expected_outputs
    # What the onnxruntime backend checks at load: names, types, and dims after a dynamic batch
    # dimension (-1 in the config: any size there, a fixed one where the config has one).
    session = onnxruntime.InferenceSession(
        str(written.folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    types = {fp32: "tensor(float)", model_config_pb2.TYPE_INT16: "tensor(int16)"}
    for ports, tensors in ((session.get_inputs(), config.input), (session.get_outputs(), config.output)):  # fmt: skip
        assert [port.name for port in ports] == [t.name for t in tensors]
        for port, tensor in zip(ports, tensors, strict=True):
            assert port.type == types[tensor.data_type]
            assert isinstance(port.shape[0], str)  # the batch dimension is dynamic
            assert len(port.shape) == 1 + len(tensor.dims)
            for got, want in zip(port.shape[1:], tensor.dims, strict=True):
                assert isinstance(got, str) if want == -1 else got == want


def test_clients_see_the_python_backend_entry_s_tensors(made: dict[str, Any]) -> None:
    """Model.remote reads the config and settles on exactly the tensors it sends the
    Python-backend entry: same names, dims, datatypes, batch axis."""
    module = made[32]
    ours = _served_wires(module, _config(made["entry32"].folder))
    schema = load(made["root"] / "hits32.soa").unwrap()
    text = build_config(schema, "ArrayNet", Options(backend="python"))
    from soagen.serving.model_config import render

    python_entry = text_format.Parse(render(text), model_config_pb2.ModelConfig())
    assert ours == _served_wires(module, python_entry)
    assert all(wire.batched for wire in (*ours[0], *ours[1]))


@pytest.mark.parametrize("align", [32, 256])
def test_the_entry_answers_clients_as_the_original_model(made: dict[str, Any], align: int) -> None:
    module, written = made[align], made[f"entry{align}"]
    config = _config(written.folder)
    session = onnxruntime.InferenceSession(
        str(written.folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    for n in (0, 1, 5, 130):
        hits = _hits(module, n, seed=n)
        score, pair = _through_entry(session, module, config, hits)
        assert score.shape == (n,) and pair.shape == (n, 2)
        want_score, want_pair = _original(made["array"], module, hits)
        torch.testing.assert_close(score, want_score, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pair, want_pair, rtol=1e-5, atol=1e-5)
    # Slices: the client sends only their elements, from the middle and the buffer's end.
    hits = _hits(module, 200, seed=7)
    for start, stop in ((3, 90), (150, 200), (199, 200)):
        part = hits.slice(start, stop)
        got = _through_entry(session, module, config, part)
        for actual, expected in zip(got, _original(made["array"], module, part), strict=True):
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_the_readme_gnn_entry_equals_ort_and_eager(made: dict[str, Any]) -> None:
    """The README's GNN (index inputs, a scatter) through its entry, by the generated classes."""
    import sys

    sys.path.insert(0, str(REPO))
    from examples.gnn_model import build_model, fill_examples
    from generated.gnn import EdgeClassifier, Edges, Nodes

    root = made["root"]
    net = build_model()
    path = export_gnn(net, root / "gnn.onnx")
    written = write_model(
        Request(
            schema=REPO / "schemas" / "gnn.soa",
            model="EdgeClassifier",
            repository=root / "gnn_repository",
            backend="onnxruntime",
            package=path,
            examples=f"{(REPO / 'examples' / 'gnn_model.py').as_posix()}:fill_examples",
        )
    )
    config = json_format.MessageToDict(_config(written.folder), preserving_proto_field_name=True)
    entries = {entry["name"]: entry for entry in (*config["input"], *config["output"])}
    wires = {
        spec.name: _served("EdgeClassifier", "test", onnx_entry.wire_tensor(spec), entries, True)
        for spec in (*EdgeClassifier.INPUTS, *EdgeClassifier.OUTPUTS)
    }
    session = onnxruntime.InferenceSession(
        str(written.folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    for nodes_n, edges_n in ((1, 1), (40, 0), (100, 700)):
        nodes, edges = Nodes.allocate(nodes_n), Edges.allocate(edges_n)
        fill_examples({"Nodes": nodes, "Edges": edges})
        collections = {"node_features": nodes, "edge_index": edges, "edge_features": edges}
        feeds = {}
        for spec in EdgeClassifier.INPUTS:
            wire = wires[spec.name]
            host, _ = _host_array(_wire_source(collections[spec.name], spec.block, wire), wire)
            feeds[spec.name] = numpy.ascontiguousarray(host[None])
        (answer,) = session.run(["edge_scores"], feeds)
        assert answer.shape == (1, edges_n)
        scores = _declared_tensor(answer[0], wires["edge_scores"])
        views = [collections[s.name].block(s.block).contiguous() for s in EdgeClassifier.INPUTS]
        with torch.no_grad():
            torch.testing.assert_close(scores, net(*views), rtol=1e-4, atol=1e-5)


def test_a_model_that_does_not_fit_is_a_usage_error_naming_both_sides(
    made: dict[str, Any],
) -> None:
    root = made["root"]
    status, _, stderr = run_cli(
        "triton",
        str(root / "hits32.soa"),
        "--model",
        "ArrayNet",
        "-o",
        str(root / "refused"),
        "--backend",
        "onnxruntime",
        "--package",
        str(made["wide"]),
    )
    assert status == 2, stderr
    assert "input 'points' (bound to 'points') has 4 in dimension 0, the block 3" in stderr
    assert "the ONNX model: inputs points float32 [4, n]" in stderr
    assert "the schema: inputs points float32 [3, n]" in stderr
    assert not (root / "refused" / "ArrayNet").exists()


def test_options_an_onnxruntime_entry_cannot_honour_are_refused(made: dict[str, Any]) -> None:
    schema = load(made["root"] / "hits32.soa").unwrap()
    for options, message in (
        (Options(backend="onnxruntime", max_batch_size=8), "--max-batch-size 8"),
        (Options(backend="onnxruntime", max_batch_size=0), "--max-batch-size 0"),
        (Options(backend="onnxruntime", naming="forward"), "--naming forward"),
    ):
        with pytest.raises(TritonError, match=message):
            build_config(schema, "ArrayNet", options)
    gpu = build_config(schema, "ArrayNet", Options(backend="onnxruntime", kind="gpu", count=2))
    assert [(g.kind, g.count) for g in gpu.instance_groups] == [("KIND_GPU", 2)]
    with pytest.raises(TritonError, match="--backend onnxruntime serves an ONNX model"):
        write_model(
            Request(
                schema=made["root"] / "hits32.soa",
                model="ArrayNet",
                repository=made["root"] / "refused",
                backend="onnxruntime",
                factory=f"{(REPO / 'examples' / 'gnn_model.py').as_posix()}:build_model",
            )
        )


def test_a_wrong_adaptation_is_caught_before_anything_is_written(
    made: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test double of the adapter that swaps two of the points' rows: the check against the
    original model fails the command, and no entry is written."""
    real = onnx_entry.adapt

    def swapping(model: Any, *args: Any) -> Any:
        return swap_points_rows(real(model, *args))

    monkeypatch.setattr(onnx_entry, "adapt", swapping)
    repository = made["root"] / "swapped"
    request = Request(
        schema=made["root"] / "hits32.soa",
        model="ArrayNet",
        repository=repository,
        backend="onnxruntime",
        package=made["array"],
    )
    with pytest.raises(TritonError, match="disagrees with the original model on output 'score'"):
        write_model(request)
    assert not (repository / "ArrayNet").exists()
