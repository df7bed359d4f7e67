"""`soagen serve` and `Model.remote(url)` against a real Triton server on 127.0.0.1.

The tests start `soagen serve` (NVIDIA PyTriton's tritonserver) as a subprocess on free loopback
ports and stop it at the end; a second server is started to be killed mid-run. They skip cleanly
where PyTriton or tritonclient is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from soagen.serving.wire import wire_tensor
from tests.helpers import (
    REPO,
    SERVE_GNN,
    assert_no_host_device_copies,
    free_ports,
    modules_imported_by,
    run_cli,
    serve_gnn_command,
    serve_ready,
)

torch = pytest.importorskip("torch")

from examples.gnn_model import build_model  # noqa: E402
from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes  # noqa: E402
from soagen.runtime import BindingError, IndexRangeError, SoaRuntimeError  # noqa: E402
from soagen.serving import (  # noqa: E402
    RemoteConfigurationError,
    RemoteInferenceError,
    RemoteResponseError,
    RemoteUnavailableError,
)

needs_triton = pytest.mark.skipif(
    any(
        __import__("importlib").util.find_spec(name) is None
        for name in ("pytriton", "tritonclient")
    ),
    reason="nvidia-pytriton (soagen[serve]) is not installed",
)

_START_TIMEOUT_S = 90


@dataclass
class Served:
    url: str
    token: str
    process: subprocess.Popen[str]
    log: Path
    workspace: str


def _start_server(
    folder: Path,
    *extra: str,
    model_file: Path | None = None,
    model: tuple[str, ...] | None = None,
) -> Served:
    token_file, log = folder / "token", folder / "server.log"
    with log.open("w") as log_file:
        # A session of its own, so a test can kill the server with everything it started.
        process = subprocess.Popen(
            serve_gnn_command(token_file, *extra, model_file=model_file, model=model),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            start_new_session=True,
            # Workspaces, and the folder tritonserver unpacks the model into, stay in the test's
            # (which may be too deep for PyTriton's sockets: the server then uses /tmp).
            env={**os.environ, "TMPDIR": str(folder)},
        )
    ready: list[dict[str, object] | None] = []
    reader = threading.Thread(target=lambda: ready.append(serve_ready(process)), daemon=True)
    reader.start()
    reader.join(_START_TIMEOUT_S)
    if not ready or ready[0] is None:
        _stop(process, hard=True)
        pytest.fail(f"soagen serve did not start:\n{log.read_text()[-4000:]}")
    token = token_file.read_text().strip()
    return Served(str(ready[0]["grpc"]), token, process, log, str(ready[0]["workspace"]))


def _forget_model_folders_of(served: Served) -> None:
    """A killed tritonserver leaves the folder it unpacked the model into (/tmp/folderXXXXXX,
    whatever TMPDIR says); its config names the server's workspace."""
    for folder in Path("/tmp").glob("folder*"):
        with contextlib.suppress(OSError):
            if served.workspace in (folder / "config.pbtxt").read_text():
                shutil.rmtree(folder)


def _stop(process: subprocess.Popen[str], *, hard: bool = False) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL if hard else signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


class _HoldingProxy:
    """A gRPC proxy on 127.0.0.1 in front of a server: every call is forwarded as it is (bytes and
    metadata), except that the next `hold` `ModelInfer` calls, then the next `gather`, are held: a
    held call waits until its caller gives up (its deadline) or `release` is set (by the test, or
    by the last of the `gather` calls), and is then forwarded only if its caller still waits (or,
    with `late`, anyway: as a server does that takes a request whose caller gave up, and writes its
    outputs; `late_answers` counts those)."""

    def __init__(self, target: str, *, hold: int = 0, gather: int = 0, late: bool = False) -> None:
        import grpc

        self.hold, self.gather, self.late = hold, gather, late
        self.late_answers = 0
        self.release = threading.Event()
        self.arrived = threading.Condition()
        self.infers: list[str] = []  # per ModelInfer: "forwarded" or "abandoned" (deadline)
        self.held = 0  # ModelInfer calls waiting now
        unlimited = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self._channel = grpc.insecure_channel(target, options=unlimited)
        proxy = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: typing.Any) -> typing.Any:
                method = details.method
                return grpc.unary_unary_rpc_method_handler(
                    lambda request, context: proxy._call(method, request, context)
                )

        self._server = grpc.server(ThreadPoolExecutor(max_workers=64), options=unlimited)
        self._server.add_generic_rpc_handlers((Handler(),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.url = f"127.0.0.1:{port}"

    def _call(self, method: str, request: bytes, context: typing.Any) -> bytes:
        import grpc

        if method.endswith("/ModelInfer"):
            ended = threading.Event()
            if not context.add_callback(ended.set):  # the caller's deadline, or it went away
                ended.set()
            with self.arrived:
                held = self.hold > 0 or self.gather > 0
                if self.hold > 0:
                    self.hold -= 1
                elif self.gather > 0:
                    self.gather -= 1
                    if self.gather == 0:
                        self.release.set()  # all gathered: they go on together
                self.held += held
                self.arrived.notify_all()
            while held and not ended.is_set() and not self.release.is_set():
                ended.wait(0.005)
            with self.arrived:
                self.held -= held
                self.infers.append("forwarded" if context.is_active() else "abandoned")
                self.arrived.notify_all()
            if not context.is_active():
                if self.late:
                    metadata = [
                        m for m in context.invocation_metadata() if not m[0].startswith(":")
                    ]
                    self._channel.unary_unary(method)(request, metadata=metadata, timeout=60)
                    with self.arrived:
                        self.late_answers += 1
                        self.arrived.notify_all()
                return b""
        metadata = [(k, v) for k, v in context.invocation_metadata() if not k.startswith(":")]
        try:
            answer: bytes = self._channel.unary_unary(method)(
                request, metadata=metadata, timeout=context.time_remaining()
            )
        except grpc.RpcError as error:
            context.abort(error.code(), error.details())  # raises
            raise
        return answer

    def wait_held(self, count: int, timeout: float = 30.0) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: self.held >= count, timeout), self.held

    def outcomes(self, count: int, timeout: float = 30.0) -> list[str]:
        """What became of the `ModelInfer` calls, once `count` were decided."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.infers) >= count, timeout)
            return list(self.infers)

    def close(self) -> None:
        self.release.set()
        self._server.stop(grace=None)
        self._channel.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # A longer queue delay than the default (20 ms, not 0.5) makes batching of concurrent events
    # certain even on a loaded machine; a lone request waits that long.
    served = _start_server(tmp_path_factory.mktemp("serve"), "--max-queue-delay-us", "20000")
    try:
        yield served
    finally:
        _stop(served.process)


@pytest.fixture(scope="module")
def aot_server(
    tmp_path_factory: pytest.TempPathFactory, gnn_build: tuple[Path, str, str]
) -> Iterator[Served]:
    """`soagen serve --model-file` of the example GNN's AOTInductor package."""
    served = _start_server(tmp_path_factory.mktemp("serve_aot"), model_file=gnn_build[0])
    try:
        yield served
    finally:
        _stop(served.process)


def _event(nodes_n: int, edges_n: int, seed: int) -> tuple[Nodes, Edges]:
    generator = torch.Generator().manual_seed(seed)
    nodes = Nodes.allocate(nodes_n, zero=True)
    edges = Edges.allocate(edges_n, zero=True)
    for column in (nodes.x, nodes.y, nodes.z, edges.delta_eta):
        column.copy_(torch.randn(column.shape, generator=generator))
    for column in (nodes.energy, edges.delta_r):
        column.copy_(torch.rand(column.shape, generator=generator))
    for column in (edges.src, edges.dst):
        column.copy_(torch.randint(0, max(nodes_n, 1), column.shape, generator=generator))
    return nodes, edges


@pytest.fixture(scope="module")
def local() -> EdgeClassifier:
    return EdgeClassifier(build_model())


def _expected(local: EdgeClassifier, nodes: Nodes, edges: Edges) -> torch.Tensor:
    out = EdgeScores.allocate(edges.size, zero=True)
    local(nodes, edges, out=out)
    return out.score.clone()


def _block_bytes(nodes: Nodes, edges: Edges) -> int:
    return nodes.size * 4 * 4 + edges.size * (2 * 8 + 2 * 4)


# The wire form needs no server.


def test_blocks_travel_in_storage_order_with_one_event_per_request() -> None:
    inputs = {spec.name: wire_tensor(spec) for spec in EdgeClassifier.INPUTS}
    outputs = {spec.name: wire_tensor(spec) for spec in EdgeClassifier.OUTPUTS}
    # [n, c] columns travel as [c, n]: one contiguous copy per column, no transpose.
    assert inputs["node_features"].order == (1, 0)
    assert inputs["node_features"].dims == (4, -1)
    assert inputs["node_features"].describe() == "node_features: FP32 [1, 4, n]"
    assert inputs["edge_index"].order == (0, 1)
    assert inputs["edge_index"].dims == (2, -1)
    assert inputs["edge_index"].datatype == "INT64"
    assert outputs["edge_scores"].dims == (-1,)
    assert inputs["node_features"].inverse == (1, 0)


def _wire_request(nodes: Nodes, edges: Edges) -> object:
    """A request as PyTriton hands it to the server's function: `.data`, wire arrays by name."""
    collections = {"node_features": nodes, "edge_index": edges, "edge_features": edges}
    data = {}
    for spec in EdgeClassifier.INPUTS:
        wire = wire_tensor(spec)
        view = collections[spec.name].block(spec.block).permute(wire.order)
        data[wire.name] = view.contiguous().numpy()[None]
    return type("Request", (), {"data": data})()


@needs_triton
def test_an_answer_of_empty_outputs_is_refused_with_its_known_cause() -> None:
    # PyTriton 0.7.0 beside NumPy 2 (seen on a GPU image) answered every output with 0 bytes at
    # its declared shape: the client's refusal says so. Real gRPC responses, as they arrive.
    from tritonclient.grpc import InferResult, service_pb2

    from soagen.serving.client import _event_error
    from soagen.serving.wire import ERROR_OUTPUT

    def answer(error: bytes, scores: bytes) -> InferResult:
        proto = service_pb2.ModelInferResponse()
        for name, datatype, shape in (
            (ERROR_OUTPUT, "BYTES", [1]),
            ("edge_scores", "FP32", [1, 3]),
        ):
            output = proto.outputs.add()
            output.name, output.datatype = name, datatype
            output.shape.extend(shape)
        proto.raw_output_contents.extend([error, scores])
        return InferResult(proto)

    found = _event_error(answer(b"", b""))
    assert "could not be read" in found
    assert "every output in the answer is empty (0 bytes)" in found and "NumPy < 2" in found
    # A soagen_error output that is well formed is read, and says nothing else.
    assert _event_error(answer(len(b"oops").to_bytes(4, "little") + b"oops", bytes(12))) == "oops"
    assert _event_error(answer(bytes(4), bytes(12))) == ""
    # Unreadable, but the answer is not all empty: no guess at a cause.
    found = _event_error(answer(b"\x01", bytes(12)))
    assert "could not be read" in found and "NumPy" not in found


def test_an_event_that_fails_among_others_is_answered_alone(local: EdgeClassifier) -> None:
    # PyTriton fails a whole execution when its function raises: the server answers a bad event
    # with its error and placeholder outputs, and the events batched with it keep their results.
    import numpy as np

    from soagen.runtime import ensure_cpu_settings
    from soagen.runtime.errors import IndexRangeError
    from soagen.serving.server import EventRunner
    from soagen.serving.wire import ERROR_OUTPUT

    ensure_cpu_settings()  # as `soagen serve` does before it starts: same threads as local calls
    runner = EventRunner(local, {"Nodes": Nodes, "Edges": Edges}, "cpu")
    good = [_event(10 + k, 30 + k, k) for k in range(2)]
    bad_nodes, bad_edges = _event(10, 30, 7)
    bad_edges.dst[4] = 10  # not a node
    answers = runner(
        [_wire_request(*good[0]), _wire_request(bad_nodes, bad_edges), _wire_request(*good[1])]
    )
    for (nodes, edges), answer in zip(good, answers[::2], strict=True):
        assert answer[ERROR_OUTPUT].tolist() == [[b""]]
        assert torch.equal(
            torch.from_numpy(answer["edge_scores"][0]), _expected(local, nodes, edges)
        )
    failed = answers[1]
    assert failed["edge_scores"].shape == (1, 1)  # PyTriton cannot send empty arrays
    message = failed[ERROR_OUTPUT].reshape(-1)[0].decode()
    assert message.startswith("IndexRangeError: EdgeClassifier: input 'edge_index' holds indices")
    assert failed[ERROR_OUTPUT].dtype.kind == "S" and np.all(answers[0][ERROR_OUTPUT] == b"")
    # Alone in its execution, the event fails as a Triton error (any client reads those).
    with pytest.raises(IndexRangeError):
        runner([_wire_request(bad_nodes, bad_edges)])


def test_a_server_sizes_the_output_collections_a_writing_model_stores_into(
    local: EdgeClassifier,
) -> None:
    # A model that stores into its output blocks (as a package built with --write-outputs does)
    # is handed collections the server allocates per event. EdgeScores is a layout of its own
    # and the inputs span two: `--output-size edge_scores=edge_features` sizes it per event.
    from soagen.runtime import ensure_cpu_settings
    from soagen.runtime.backends import Backend, Runner
    from soagen.serving.errors import ServeError
    from soagen.serving.server import EventRunner
    from soagen.serving.wire import ERROR_OUTPUT

    class Writing(Backend):
        kind = "aot"
        records_autograd = False
        writes_outputs = True
        moves_version_counters = False

        def place(self, device: torch.device) -> Runner:
            def run(tensors: object) -> object:
                *inputs, scores = typing.cast(list[torch.Tensor], tensors)
                with torch.no_grad():
                    scores.copy_(model(*inputs))
                return []

            return run

    ensure_cpu_settings()
    model = build_model()
    writing = EdgeClassifier(Writing("a writing double"))
    layouts = {"Nodes": Nodes, "Edges": Edges, "EdgeScores": EdgeScores}
    with pytest.raises(ServeError, match="give --output-size edge_scores=INPUT"):
        EventRunner(writing, layouts, "cpu")
    with pytest.raises(ServeError, match="'nodes' is neither an input of EdgeClassifier"):
        EventRunner(writing, layouts, "cpu", {"edge_scores": "nodes"})
    with pytest.raises(ServeError, match=r"output sizes \(--output-size\) are for a model that"):
        EventRunner(local, layouts, "cpu", {"edge_scores": "edge_features"})
    runner = EventRunner(writing, layouts, "cpu", {"edge_scores": "edge_features"})

    class Recording(Writing):
        """Records its output's count, as a package built with --write-outputs does."""

        output_counts = {"edge_scores": "edge_index"}

    recording = EdgeClassifier(Recording("a recording double"))
    EventRunner(recording, layouts, "cpu")  # nothing else needed: the model says
    EventRunner(recording, layouts, "cpu", {"edge_scores": "edge_features"})  # the same layout
    with pytest.raises(ServeError, match="exported with as many elements as 'edge_index'"):
        EventRunner(recording, layouts, "cpu", {"edge_scores": "7"})
    with pytest.raises(ServeError, match="exported with as many elements as 'edge_index'"):
        EventRunner(recording, layouts, "cpu", {"edge_scores": "node_features"})
    events = [_event(10 + k, 30 + 17 * k, k) for k in range(3)]
    answers = runner([_wire_request(*event) for event in events])
    for (nodes, edges), answer in zip(events, answers, strict=True):
        assert answer[ERROR_OUTPUT].tolist() == [[b""]]
        assert torch.equal(
            torch.from_numpy(answer["edge_scores"][0]), _expected(local, nodes, edges)
        )

    class Suggesting(Writing):
        """Names its output's axis as an input's (an ONNX file's dynamic axes): a guess."""

        suggested_output_counts = {"edge_scores": "edge_index"}

    suggesting = EdgeClassifier(Suggesting("a suggesting double"))
    (answer,) = EventRunner(suggesting, layouts, "cpu")([_wire_request(*events[0])])
    assert torch.equal(torch.from_numpy(answer["edge_scores"][0]), _expected(local, *events[0]))
    # A guess never outranks a record, nor a size given for another output of its collection.
    from soagen.serving.server import _output_sizes

    class Both(Suggesting):
        output_counts = {"edge_scores": "edge_features"}

    assert _output_sizes(EdgeClassifier(Both("both")), {}) == {
        "edge_scores": {"input": "edge_features"}
    }
    # A size given overrides the guess: here wrongly, 10 scores for 30 edges.
    overridden = EventRunner(suggesting, layouts, "cpu", {"edge_scores": "node_features"})
    with pytest.raises(RuntimeError, match=r"size of tensor a \(10\) must match .* b \(30\)"):
        overridden([_wire_request(*events[0])])


def test_a_size_given_for_one_output_outranks_the_files_guesses_for_its_collection(
    generated_from_text: Callable[[str], ModuleType],
) -> None:
    from soagen.runtime.backends import Backend, Runner
    from soagen.serving.errors import ServeError
    from soagen.serving.server import _output_sizes

    module = generated_from_text(
        "layout N {\n    column float32 x\n}\n\nlayout E {\n    column float32 y\n}\n\n"
        "layout C {\n    column float32 p, q\n}\n\n"
        "model Two {\n    input  a = N{x}\n    input  b = E{y}\n"
        "    output p = C{p}\n    output q = C{q}\n}\n"
    )

    class Suggesting(Backend):
        kind = "onnxruntime"
        records_autograd = False
        writes_outputs = True
        outputs_may_overlap_inputs = True
        suggested_output_counts = {"p": "a", "q": "a"}

        def place(self, device: torch.device) -> Runner:
            return lambda tensors: []

    suggesting = module.Two(Suggesting("a suggesting double"))
    assert _output_sizes(suggesting, {}) == {"p": {"input": "a"}, "q": {"input": "a"}}
    # The outputs share C's collection: a size for one is the size of both.
    assert _output_sizes(suggesting, {"q": "b"}) == {"p": {"input": "b"}, "q": {"input": "b"}}

    class Recording(Suggesting):
        suggested_output_counts = {}
        output_counts = {"p": "a"}

    with pytest.raises(ServeError, match="outputs 'p' and 'q' share the C collection"):
        _output_sizes(module.Two(Recording("a recording double")), {"q": "b"})


def test_a_recorded_size_may_be_named_by_any_layout_its_same_n_group_ties() -> None:
    from soagen.serving.events import output_sizes, recorded_sizes_problem

    inputs = [("tracks", "Tracks"), ("hits", "Hits"), ("masks", "Masks")]
    outputs = [("scores", "Scores")]
    sizes = output_sizes("TrackNet", inputs, outputs, {"scores": "hits"})
    tied = {"Tracks": "Tracks", "Hits": "Tracks", "Masks": "Masks"}  # hits: same n as tracks
    assert recorded_sizes_problem(sizes, {"scores": "tracks"}, inputs, tied) is None
    untied = {layout: layout for _, layout in inputs}
    assert "exported with as many elements as 'tracks'" in str(
        recorded_sizes_problem(sizes, {"scores": "tracks"}, inputs, untied)
    )
    assert "exported with as many elements as 'masks'" in str(
        recorded_sizes_problem(sizes, {"scores": "masks"}, inputs, tied)
    )


def test_output_sizes_agree_within_a_collection_and_are_counts_or_inputs() -> None:
    from soagen.serving.events import OutputSizeError, output_sizes

    inputs = [("momentum", "Tracks"), ("cov", "Tracks"), ("hits", "Hits")]
    outputs = [("features", "TrackOut"), ("charge", "TrackOut")]
    agreed = output_sizes("TrackNet", inputs, outputs, {"features": "momentum", "charge": "cov"})
    assert agreed == {"features": {"input": "momentum"}, "charge": {"input": "cov"}}
    # One collection per layout: a size given for one output serves the others.
    assert output_sizes("TrackNet", inputs, outputs, {"charge": "hits"}) == {
        "features": {"input": "hits"},
        "charge": {"input": "hits"},
    }
    counted = typing.cast(dict[str, str], {"features": 5, "charge": "5"})  # the Python API's
    assert output_sizes("TrackNet", inputs, outputs, counted)["features"] == {"count": 5}
    with pytest.raises(OutputSizeError, match="'features' and 'charge' share the TrackOut"):
        output_sizes("TrackNet", inputs, outputs, {"features": "momentum", "charge": "hits"})
    with pytest.raises(OutputSizeError, match="'features' and 'charge' share the TrackOut"):
        output_sizes("TrackNet", inputs, outputs, {"features": "3", "charge": "4"})
    with pytest.raises(OutputSizeError, match="nor a count >= 1"):
        output_sizes("TrackNet", inputs, outputs, {"features": "0", "charge": "0"})


def test_a_server_refuses_a_writing_model_whose_outputs_lie_over_its_inputs(
    generated_from_text: Callable[[str], ModuleType],
) -> None:
    # The server loads inputs and outputs into one collection per layout: a package that stores
    # into members it still reads would overwrite them.
    from soagen.runtime.backends import Backend, Runner
    from soagen.serving.errors import ServeError
    from soagen.serving.server import EventRunner

    module = generated_from_text(
        "layout Hits {\n    column float32 x, y\n}\n\n"
        "model Rescale {\n    input  xy = Hits{x, y} as [n, c]\n    output x  = Hits{x}\n}\n"
    )

    class Writing(Backend):
        kind = "aot"
        records_autograd = False
        writes_outputs = True

        def place(self, device: torch.device) -> Runner:
            return lambda tensors: []

    with pytest.raises(ServeError, match="output 'x' binds members of input 'xy'"):
        EventRunner(module.Rescale(Writing("a writing double")), {"Hits": module.Hits}, "cpu")


def test_client_follows_the_servers_axis_order_and_batch_axis() -> None:
    from soagen.serving.client import _served

    wire = wire_tensor(EdgeClassifier.INPUTS[0])  # node_features as [n, c]
    storage = {
        "node_features": {"name": "node_features", "dims": ["4", "-1"], "data_type": "TYPE_FP32"}
    }
    # `soagen triton --backend pytorch` keeps the declared axes, without a batch axis.
    declared = {
        "node_features": {"name": "node_features", "dims": [-1, 4], "data_type": "TYPE_FP32"}
    }
    assert _served("M", "u", wire, storage, True) == wire
    from_repository = _served("M", "u", wire, declared, False)
    assert (from_repository.order, from_repository.batched) == ((0, 1), False)
    assert from_repository.wire_shape((7, 4)) == (7, 4) and wire.wire_shape((7, 4)) == (1, 4, 7)
    other = {"node_features": {"name": "node_features", "dims": [-1, 3], "data_type": "TYPE_FP32"}}
    with pytest.raises(RemoteConfigurationError, match=r"FP32 \[-1, 3\]"):
        _served("M", "u", wire, other, True)
    with pytest.raises(RemoteConfigurationError, match="no tensor 'node_features'"):
        _served("M", "u", wire, {}, True)


_ODD_BLOCKS = """
layout Hits {
    column bfloat16 a, b
    column float32[2, 3] m
}
model Odd {
    input ab = Hits{a, b} as [n, c]
    input mm = Hits{m} as [n, 2, 3]
    output o = Hits{a} as [n]
}
"""


def test_blocks_are_copied_once_in_wire_order_from_any_device(
    device: str, generated_from_text: Callable[[str], ModuleType]
) -> None:
    from multiprocessing.shared_memory import SharedMemory

    import numpy as np

    from soagen.runtime.buffers import tensor_of
    from soagen.serving.client import _declared_tensor, _host_array, _wire_source
    from soagen.serving.shared_memory import CudaRegion, copy_into, cuda_shared_memory

    module = generated_from_text(_ODD_BLOCKS)
    hits = module.Hits.allocate(37, zero=True)
    hits.buffer.copy_(torch.randint(0, 120, (hits.nbytes,), dtype=torch.uint8))  # no NaN patterns
    on_device = hits.to(device)
    wires = {spec.name: wire_tensor(spec) for spec in module.Odd.INPUTS}
    assert wires["mm"].order == (2, 1, 0) and wires["mm"].dims == (3, 2, -1)
    assert wires["ab"].datatype == "UINT16"  # bfloat16 travels as its bits
    for spec in module.Odd.INPUTS:
        wire = wires[spec.name]
        expected = hits.numpy(spec.block).transpose(wire.order)
        source = _wire_source(on_device, spec.block, wire)
        host, copies = _host_array(source, wire)
        assert copies == (0 if device == "cpu" else 1)
        assert np.array_equal(host, expected) and host.dtype == expected.dtype
        region = SharedMemory(create=True, size=expected.nbytes + 64)
        try:
            copy_into(region, 64, source, wire)
            copied = np.ndarray(expected.shape, expected.dtype, buffer=region.buf, offset=64)
            assert np.array_equal(copied, expected)
            # Back in declared order, as outputs come back: the block itself, bit for bit.
            back = on_device.block(spec.block).clone().zero_()
            back.copy_(_declared_tensor(copied, wire))
            bits = back.cpu().contiguous().view(torch.uint8)
            assert torch.equal(bits, hits.block(spec.block).contiguous().view(torch.uint8))
            del copied
        finally:
            region.close()
            region.unlink()
        if device.startswith("cuda") and cuda_shared_memory() is not None:
            # The same block through a CUDA shared-memory region: copied and read on the GPU.
            on_gpu = CudaRegion("soagen_test", expected.nbytes + 64, on_device.device)
            try:
                on_gpu.write(64, source, wire)
                on_gpu.settle()
                shape = tuple(int(size) for size in source.shape)
                assert torch.equal(
                    on_gpu.read(64, shape, wire).cpu(), tensor_of(expected, wire.dtype)
                )
            finally:
                on_gpu.destroy()


def test_remote_arguments_are_checked_before_any_connection() -> None:
    for kwargs, word in (
        ({"timeout": 0}, "timeout"),
        ({"retries": -1}, "retries"),
        ({"shared_memory": "yes"}, "shared_memory"),
        ({"model_name": ""}, "model_name"),
    ):
        with pytest.raises(RemoteConfigurationError, match=word):
            EdgeClassifier.remote("127.0.0.1:1", **kwargs)  # type: ignore[arg-type]
    for url in ("127.0.0.1", "http://127.0.0.1:8000", "", "host:port"):
        with pytest.raises(RemoteConfigurationError, match="url"):
            EdgeClassifier.remote(url)
    with pytest.raises(BindingError, match="index_bounds: EdgeClassifier has no input 'nodes'"):
        EdgeClassifier.remote("127.0.0.1:1", index_bounds={"edge_index": "nodes"})


def test_serving_package_imports_nothing_heavy() -> None:
    code = (
        "import soagen.serving, soagen.serving.events, soagen.serving.wire, "
        "soagen.serving.balancing, soagen.runtime"
    )
    heavy = ("torch", "numpy", "tritonclient", "pytriton")
    assert modules_imported_by(code, heavy) == []


def test_serve_usage_errors_exit_2() -> None:
    status, _, err = run_cli(*SERVE_GNN[:4])
    assert status == 2
    nope = [*SERVE_GNN[:3], "Nope", *SERVE_GNN[4:]]
    status, _, err = run_cli(*nope)
    assert status == 2 and "no model 'Nope'" in err and "EdgeClassifier" in err
    status, _, err = run_cli(*SERVE_GNN, "--grpc-port", "70000")
    assert status == 2 and "--grpc-port" in err
    status, _, err = run_cli(*SERVE_GNN, "--output-size", "edge_scores=edge_features")
    assert status == 2 and "output sizes (--output-size) are for a model that stores" in err


# A real server.


@needs_triton
@pytest.mark.parametrize("shared_memory", [False, True], ids=["grpc", "shared-memory"])
def test_round_trip_equals_local_execution(
    server: Served, local: EdgeClassifier, shared_memory: bool
) -> None:
    # The server rebuilds each event's collections (same pitches, so the same strides) and runs
    # the same module with the same thread count as the local call: results agree bit for bit.
    with EdgeClassifier.remote(
        server.url, shared_memory=shared_memory, access_token=server.token
    ) as remote:
        assert isinstance(remote, EdgeClassifier) and remote.backend == "remote"
        copied = 0
        for seed, (nodes_n, edges_n) in enumerate([(1, 1), (33, 100), (1000, 5000), (257, 4099)]):
            nodes, edges = _event(nodes_n, edges_n, seed)
            out = EdgeScores.allocate(edges_n, zero=True)
            remote(nodes, edges, out=out)
            assert torch.equal(out.score, _expected(local, nodes, edges))
            copied += _block_bytes(nodes, edges)
        assert remote.uses_shared_memory is shared_memory
        stats = remote.stats
        assert (stats.calls, stats.writes, stats.retries, stats.fallbacks) == (4, 4, 0, 0)
        # Each input block is copied once: into shared memory, or into the request's bytes.
        assert stats.bytes_copied == copied
        assert stats.bytes_shared == (copied if shared_memory else 0)
        assert stats.bytes_to_host == 0


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_collections_travel_through_cuda_shared_memory(
    server: Served, local: EdgeClassifier
) -> None:
    from soagen.serving.shared_memory import cuda_shared_memory

    if cuda_shared_memory() is None:
        pytest.skip(
            "tritonclient's CUDA utilities need cuda-python: pip install tritonclient[cuda]"
        )
    with EdgeClassifier.remote(server.url, access_token=server.token) as remote:
        copied = 0
        for seed, (nodes_n, edges_n) in enumerate([(1, 1), (33, 100), (1000, 5000)]):
            nodes, edges = _event(nodes_n, edges_n, seed)
            out = EdgeScores.allocate(edges_n, device="cuda", zero=True)
            remote(nodes.to("cuda"), edges.to("cuda"), out=out)
            assert torch.equal(out.score.cpu(), _expected(local, nodes, edges))
            assert remote.uses_cuda_shared_memory, remote.cuda_shared_memory_refusal
            copied += _block_bytes(nodes, edges)
        # Each block is copied once, on the GPU, into the region the server reads.
        stats = remote.stats
        assert (stats.bytes_copied, stats.bytes_shared, stats.bytes_to_host) == (copied, copied, 0)
        # The index check reads two numbers back and raises here: no device-side assert, which
        # would end this process's CUDA context.
        host_nodes, host_edges = _event(300, 1000, 8)
        host_edges.src[5] = 300  # not a node
        nodes, edges = host_nodes.to("cuda"), host_edges.to("cuda")
        out = EdgeScores.allocate(1000, device="cuda", zero=True)
        with pytest.raises(IndexRangeError, match="edge_index"):
            remote(nodes, edges, out=out)
        edges.src[5] = 0
        remote(nodes, edges, out=out)
        assert bool((out.score > 0).all())
    # Unchecked (the caller vouches for the indices), a call copies nothing between host and GPU.
    with EdgeClassifier.remote(
        server.url, access_token=server.token, index_bounds={"edge_index": None}
    ) as remote:
        nodes, edges = (collection.to("cuda") for collection in _event(2_000, 20_000, 9))
        out = EdgeScores.allocate(edges.size, device="cuda")
        remote(nodes, edges, out=out)  # registers the region
        stream = torch.cuda.current_stream()
        assert_no_host_device_copies(lambda: remote(nodes, edges, out=out), stream)


@needs_triton
def test_an_aot_package_serves_and_a_bad_index_fails_only_its_own_call(
    aot_server: Served, gnn_build: tuple[Path, str, str]
) -> None:
    # Inside AOTInductor's kernels an index out of range aborts the process: served, that would
    # take the server down for every client. The schema's bound stops the event first.
    local = EdgeClassifier.load(gnn_build[0])
    unchecked = {"edge_index": None}  # so that the bad event reaches the server
    with EdgeClassifier.remote(
        aot_server.url, access_token=aot_server.token, index_bounds=unchecked
    ) as remote:
        for seed, (nodes_n, edges_n) in enumerate([(1, 1), (300, 1000), (257, 4099)]):
            nodes, edges = _event(nodes_n, edges_n, seed)
            out, expected = EdgeScores.allocate(edges_n), EdgeScores.allocate(edges_n)
            remote(nodes, edges, out=out)
            local(nodes, edges, out=expected)
            assert torch.equal(out.score, expected.score)
        nodes, edges = _event(300, 1000, 7)
        edges.src[3] = 10_000  # not a node
        out = EdgeScores.allocate(1000, zero=True)
        with pytest.raises(RemoteInferenceError, match="IndexRangeError"):
            remote(nodes, edges, out=out)
        assert bool((out.score == 0).all())
        edges.src[3] = 0
        remote(nodes, edges, out=out)  # the server is still there
        assert aot_server.process.poll() is None


@needs_triton
def test_a_package_that_writes_its_outputs_is_served(
    tmp_path: Path, tracks: tuple[ModuleType, Path, Path]
) -> None:
    # `soagen compile --write-outputs` (the fastest package) served by `soagen serve`: the server
    # allocates each event's output collection (TrackOut, sized as the one input layout), the
    # package stores into it, and the client gets what a local call writes, bit for bit. The
    # schema's block of scalars (`bfield`) travels once per element and is stored once.
    module, _, package = tracks
    schema = package.parent.parent / "tracks.soa"
    model = ("serve", str(schema), "--model", "TrackNet", "--model-file", str(package))
    served = _start_server(tmp_path, model=model)
    local = module.TrackNet.load(package)
    generator = torch.Generator().manual_seed(3)
    try:
        with module.TrackNet.remote(served.url, access_token=served.token) as remote:
            for n in (1, 40, 333):
                tracks_in = module.Tracks.allocate(n)
                tracks_in.block("momentum").copy_(torch.randn(3, n, generator=generator))
                tracks_in.cov.copy_(torch.randn(n, 3, 3, generator=generator))
                tracks_in.bfield.fill_(float(n))
                out = module.TrackOut.allocate(n, zero=True)
                expected = module.TrackOut.allocate(n, zero=True)
                remote(tracks_in, out=out)
                local(tracks_in, out=expected)
                assert torch.equal(out.block("features"), expected.block("features"))
                assert torch.equal(out.q, expected.q) and bool(out.q.any())
    finally:
        _stop(served.process)


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_gpu_server_refuses_a_bad_index_and_serves_on(
    tmp_path: Path, local: EdgeClassifier
) -> None:
    # On a GPU the binding's own check is a device-side assert, after which every request would
    # fail: the server checks events on the host first.
    served = _start_server(tmp_path, "--device", "cuda")
    try:
        with EdgeClassifier.remote(
            served.url, access_token=served.token, index_bounds={"edge_index": None}
        ) as remote:
            nodes, edges = _event(300, 1000, 7)
            edges.src[3] = 300  # not a node
            out = EdgeScores.allocate(1000, zero=True)
            with pytest.raises(RemoteInferenceError, match=r"outside \[0, 300\)"):
                remote(nodes, edges, out=out)
            assert bool((out.score == 0).all())
            edges.src[3] = 0
            remote(nodes, edges, out=out)
            torch.testing.assert_close(
                out.score, _expected(local, nodes, edges), rtol=1e-4, atol=1e-5
            )
    finally:
        _stop(served.process)


@needs_triton
def test_slices_are_sent_as_events(server: Served, local: EdgeClassifier) -> None:
    nodes, edges = _event(3000, 3000, 7)
    # A slice's indices count the slice's own nodes (the last slice has 952).
    edges.src.copy_(torch.arange(3000) % 952)
    edges.dst.copy_(torch.arange(3000) * 7 % 952)
    out, expected = EdgeScores.allocate(3000, zero=True), EdgeScores.allocate(3000, zero=True)
    slices = ((0, 1024), (1024, 2048), (2048, 3000))
    batched, expected_batched = EdgeScores.allocate(3000), EdgeScores.allocate(3000)
    with EdgeClassifier.remote(server.url, access_token=server.token) as remote:
        for start, stop in slices:
            remote(nodes[start:stop], edges[start:stop], out=out[start:stop])
        assert remote.stats.calls == 3
        # batch_size slices the edges and sends every event all nodes (`node_features` is whole).
        remote(nodes, edges, out=batched, batch_size=1024)
        assert remote.stats.calls == 6
    for start, stop in slices:
        local(nodes[start:stop], edges[start:stop], out=expected[start:stop])
    assert torch.equal(out.score, expected.score)
    local(nodes, edges, out=expected_batched, batch_size=1024)
    torch.testing.assert_close(batched.score, expected_batched.score)


@needs_triton
def test_concurrent_clients_are_batched_by_the_server(
    server: Served, local: EdgeClassifier
) -> None:
    remote = EdgeClassifier.remote(server.url, access_token=server.token)
    config = remote._client.get_model_config("EdgeClassifier", as_json=True)["config"]
    assert all(entry["allow_ragged_batch"] for entry in config["input"])
    before = remote.server_statistics()
    events = [_event(50 + k, 200 + 13 * k, 100 + k) for k in range(32)]
    # The first request of every client is held until all are there, and then they go together:
    # the server has them queued at once, however loaded this machine is.
    proxy = _HoldingProxy(server.url, gather=len(events))
    outs = [EdgeScores.allocate(edges.size, zero=True) for _, edges in events]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(events))

    def call(k: int) -> None:
        # A client of its own, as each reconstruction job has (its own channel and region).
        try:
            with EdgeClassifier.remote(proxy.url, access_token=server.token) as own:
                barrier.wait()
                nodes, edges = events[k]
                for _ in range(2):
                    own(nodes, edges, out=outs[k])
        except BaseException as error:  # collected, re-raised below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(events))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        proxy.close()
    assert not errors, errors
    assert proxy.outcomes(2 * len(events)) == ["forwarded"] * 2 * len(events)
    for (nodes, edges), out in zip(events, outs, strict=True):
        assert torch.equal(out.score, _expected(local, nodes, edges))
    after = remote.server_statistics()
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert inferences == 2 * len(events)
    assert executions < inferences  # events of different sizes shared executions
    remote.close()


@needs_triton
def test_server_errors_name_the_url_and_leave_the_output_untouched(server: Served) -> None:
    nodes, edges = _event(10, 20, 3)
    edges.src[5] = 99  # not a node
    out = EdgeScores.allocate(20, zero=True)
    out.score.fill_(-1.0)
    before = bytes(out.buffer.numpy())
    # The client checks the schema's index bound first: the event never leaves.
    with EdgeClassifier.remote(server.url, access_token=server.token) as remote:
        with pytest.raises(IndexRangeError, match="edge_index"):
            remote(nodes, edges, out=out)
        assert remote.stats.attempts == 0
    # Unchecked here, the server's own check answers.
    unchecked = {"edge_index": None}
    with EdgeClassifier.remote(
        server.url, access_token=server.token, index_bounds=unchecked
    ) as remote:
        with pytest.raises(RemoteInferenceError, match="IndexRangeError") as caught:
            remote(nodes, edges, out=out)
        assert server.url in str(caught.value) and "nothing was written" in str(caught.value)
        assert isinstance(caught.value, SoaRuntimeError)
        assert remote.stats.retries == 0  # an answer is not retried
    assert bytes(out.buffer.numpy()) == before


@needs_triton
@pytest.mark.parametrize("shared_memory", [False, True], ids=["grpc", "shared-memory"])
def test_a_bad_event_fails_only_its_own_call(
    server: Served, local: EdgeClassifier, shared_memory: bool
) -> None:
    # Concurrent events share executions (a proxy holds them until all are there, and the
    # server's queue delay is 20 ms): one bad event among them fails its own call, and every
    # other call gets its results. The client's own index check is off, so that the bad event
    # reaches the server.
    events = [_event(20 + k, 60 + 7 * k, 40 + k) for k in range(8)]
    proxy = _HoldingProxy(server.url, gather=len(events))
    remote = EdgeClassifier.remote(
        proxy.url,
        shared_memory=shared_memory,
        access_token=server.token,
        index_bounds={"edge_index": None},
    )
    events[3][1].src[11] = 1000  # not a node
    outs = [EdgeScores.allocate(edges.size, zero=True) for _, edges in events]
    for out in outs:
        out.score.fill_(-1.0)
    raised: dict[int, BaseException] = {}
    barrier = threading.Barrier(len(events))

    def call(k: int) -> None:
        try:
            barrier.wait()
            remote(*events[k], out=outs[k])
        except BaseException as error:  # collected, checked below
            raised[k] = error

    before = remote.server_statistics()
    warned_before = server.log.read_text().count(_BATCHED_FAILURE)
    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(events))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        after = remote.server_statistics()
        remote.close()
    finally:
        proxy.close()
    assert proxy.outcomes(len(events)) == ["forwarded"] * len(events)
    assert list(raised) == [3], raised
    assert isinstance(raised[3], RemoteInferenceError)
    assert "IndexRangeError" in str(raised[3]) and "nothing was written" in str(raised[3])
    assert bool((outs[3].score == -1.0).all())
    for k, ((nodes, edges), out) in enumerate(zip(events, outs, strict=True)):
        if k != 3:
            assert torch.equal(out.score, _expected(local, nodes, edges))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert executions < len(events)  # events shared executions
    # The bad event failed among others (answered in soagen_error), not alone in its execution,
    # where it would have been a Triton error and the others' results untouched by it anyway.
    assert server.log.read_text().count(_BATCHED_FAILURE) == warned_before + 1


# What `soagen serve` logs for an event that failed in an execution shared with others.
_BATCHED_FAILURE = "an event failed among others batched with it"


@needs_triton
@pytest.mark.parametrize("shared_memory", [False, True], ids=["grpc", "shared-memory"])
@pytest.mark.parametrize("out_size", [19, 21])
def test_a_response_that_does_not_fit_is_refused_before_writing(
    server: Served, shared_memory: bool, out_size: int
) -> None:
    nodes, edges = _event(10, 20, 4)
    out = EdgeScores.allocate(out_size, zero=True)
    out.score.fill_(-1.0)
    before = bytes(out.buffer.numpy())
    with EdgeClassifier.remote(
        server.url, shared_memory=shared_memory, access_token=server.token
    ) as remote:
        with pytest.raises(RemoteResponseError, match="edge_scores|output") as caught:
            remote(nodes, edges, out=out)
        assert "nothing was written" in str(caught.value)
    assert bytes(out.buffer.numpy()) == before


@needs_triton
def test_shared_memory_needs_the_servers_token(server: Served, local: EdgeClassifier) -> None:
    nodes, edges = _event(40, 80, 5)
    out = EdgeScores.allocate(80, zero=True)
    with EdgeClassifier.remote(server.url, shared_memory=True) as remote:
        with pytest.raises(RemoteConfigurationError, match="access_token"):
            remote(nodes, edges, out=out)
    # By default a refusal means blocks travel in the request instead.
    with EdgeClassifier.remote(server.url) as remote:
        assert remote.uses_shared_memory
        remote(nodes, edges, out=out)
        assert not remote.uses_shared_memory and remote.stats.bytes_shared == 0
    assert torch.equal(out.score, _expected(local, nodes, edges))


@needs_triton
def test_close_unregisters_and_removes_shared_memory(server: Served) -> None:
    import tritonclient.grpc

    nodes, edges = _event(40, 80, 6)
    out = EdgeScores.allocate(80, zero=True)
    remote = EdgeClassifier.remote(server.url, shared_memory=True, access_token=server.token)
    remote(nodes, edges, out=out)
    remote(nodes, edges, out=out)  # the same region again
    prefix = remote._pool.prefix
    assert len(list(Path("/dev/shm").glob(f"{prefix}*"))) == 1
    remote.close()
    assert not list(Path("/dev/shm").glob(f"{prefix}*"))
    client = tritonclient.grpc.InferenceServerClient(server.url)
    headers = {"triton-grpc-protocol-triton-access-token": server.token}
    status = client.get_system_shared_memory_status(headers=headers, as_json=True)
    assert not [name for name in status.get("regions", {}) if name.startswith(prefix)]
    client.close()
    with pytest.raises(RemoteConfigurationError, match="closed"):
        remote(nodes, edges, out=out)


@needs_triton
def test_close_waits_for_the_calls_in_flight(server: Served, local: EdgeClassifier) -> None:
    # A proxy holds the request until close() has begun: close() returns only after the call,
    # whose result is whole; before, close() tore its region down under it.
    proxy = _HoldingProxy(server.url, hold=1)
    nodes, edges = _event(1000, 5000, 9)
    expected = EdgeScores.allocate(5000, zero=True)
    local(nodes, edges, out=expected)
    out = EdgeScores.allocate(5000, zero=True)
    remote = EdgeClassifier.remote(
        proxy.url, shared_memory=True, access_token=server.token, timeout=60
    )
    finished: list[float] = []
    failures: list[BaseException] = []
    closed: list[float] = []

    def call() -> None:
        try:
            remote(nodes, edges, out=out)
        except BaseException as error:  # reported below
            failures.append(error)
        finished.append(time.monotonic())

    def close() -> None:
        remote.close()
        closed.append(time.monotonic())

    try:
        worker = threading.Thread(target=call)
        worker.start()
        proxy.wait_held(1)  # the request is on its way, and stays there
        assert remote.stats.attempts == 1 and not finished
        closer = threading.Thread(target=close)
        closer.start()
        deadline = time.monotonic() + 30
        while not remote._closed and time.monotonic() < deadline:
            time.sleep(0.001)  # close() has begun: no call starts from here on
        assert remote._closed and not closed and not finished
        proxy.release.set()
        worker.join(60)
        closer.join(60)
    finally:
        proxy.close()
    assert not failures, failures
    assert proxy.outcomes(1) == ["forwarded"]
    assert finished[0] <= closed[0]
    assert torch.equal(out.score, expected.score)
    assert not list(Path("/dev/shm").glob(f"{remote._pool.prefix}*"))
    with pytest.raises(RemoteConfigurationError, match="closed"):
        remote(nodes, edges, out=out)


@needs_triton
@pytest.mark.parametrize("shared_memory", [False, True], ids=["grpc", "shared-memory"])
def test_a_stalled_request_hits_its_deadline_and_is_retried(
    server: Served, local: EdgeClassifier, shared_memory: bool
) -> None:
    """A proxy holds requests past the client's deadline (DEADLINE_EXCEEDED, transient): the
    call is sent again and succeeds; when every attempt stalls, it raises RemoteUnavailableError
    and writes nothing."""
    proxy = _HoldingProxy(server.url, hold=1)
    nodes, edges = _event(30, 60, 8)
    out = EdgeScores.allocate(60, zero=True)
    try:
        with EdgeClassifier.remote(
            proxy.url,
            timeout=1.5,
            retries=1,
            shared_memory=shared_memory,
            access_token=server.token,
        ) as remote:
            remote(nodes, edges, out=out)
            assert proxy.outcomes(2) == ["abandoned", "forwarded"]
            assert (remote.stats.attempts, remote.stats.retries, remote.stats.writes) == (2, 1, 1)
            assert torch.equal(out.score, _expected(local, nodes, edges))

            out.score.fill_(-1.0)
            before = bytes(out.buffer.numpy())
            proxy.hold = 2  # both attempts stall
            url = proxy.url.replace(".", r"\.")
            with pytest.raises(
                RemoteUnavailableError,
                match=rf"the Triton server at {url} did not answer \(2 attempts in \d+\.\d s, "
                r"timeout 1\.5 s each\): Deadline Exceeded; nothing was written",
            ):
                remote(nodes, edges, out=out)
            assert proxy.outcomes(4) == ["abandoned", "forwarded", "abandoned", "abandoned"]
            assert (remote.stats.attempts, remote.stats.retries, remote.stats.writes) == (4, 2, 1)
            assert bytes(out.buffer.numpy()) == before
    finally:
        proxy.close()


@needs_triton
def test_unreachable_server_raises_or_falls_back(local: EdgeClassifier) -> None:
    (port,) = free_ports(1)
    url = f"127.0.0.1:{port}"
    nodes, edges = _event(30, 60, 8)
    out = EdgeScores.allocate(60, zero=True)
    out.score.fill_(-1.0)
    before = bytes(out.buffer.numpy())
    with EdgeClassifier.remote(url, timeout=2, retries=2) as remote:
        with pytest.raises(RemoteUnavailableError, match=url) as caught:
            remote(nodes, edges, out=out)
        assert isinstance(caught.value, ConnectionError) and "3 attempts" in str(caught.value)
        assert remote.stats.retries == 2
    assert bytes(out.buffer.numpy()) == before
    with EdgeClassifier.remote(url, retries=0, fallback=build_model()) as remote:
        remote(nodes, edges, out=out)
        assert (remote.stats.fallbacks, remote.stats.writes) == (1, 0)
    assert torch.equal(out.score, _expected(local, nodes, edges))


def _tritonserver_of(process: subprocess.Popen[str]) -> int:
    """The pid of the tritonserver that a `soagen serve` process started."""
    for task in Path(f"/proc/{process.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().strip() == "tritonserver":
                return int(child)
    raise AssertionError("soagen serve runs no tritonserver")


def _processes_of(served: Served) -> list[int]:
    """Processes still running a program from the server's workspace (its backend stubs)."""
    marker = served.workspace.encode() + b"/"
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(marker):
                found.append(int(entry.name))
    return found


@needs_triton
def test_server_killed_mid_run_loses_no_event_and_writes_none_twice(
    tmp_path: Path, local: EdgeClassifier
) -> None:
    served = _start_server(tmp_path)
    events = [_event(20 + k % 7, 50 + k, 1000 + k) for k in range(40)]
    outs = [EdgeScores.allocate(edges.size, zero=True) for _, edges in events]
    for out in outs:
        out.score.fill_(-1.0)
    remote = EdgeClassifier.remote(
        served.url, access_token=served.token, timeout=5, retries=1, fallback=local
    )
    outcomes: list[int] = []  # writes + fallbacks that each call added: exactly 1 each
    killed = threading.Event()

    def run() -> None:
        for k, ((nodes, edges), out) in enumerate(zip(events, outs, strict=True)):
            if k == 30:
                killed.wait(60)  # the last events come after the kill, whatever the timing
            done = remote.stats.writes + remote.stats.fallbacks
            remote(nodes, edges, out=out)
            outcomes.append(remote.stats.writes + remote.stats.fallbacks - done)

    worker = threading.Thread(target=run)
    worker.start()
    while len(outcomes) < 10 and worker.is_alive():
        time.sleep(0.001)
    # tritonserver dies while calls stream (one is likely in flight); soagen serve sees it go.
    os.kill(_tritonserver_of(served.process), signal.SIGKILL)
    killed.set()
    worker.join(120)
    assert not worker.is_alive()
    assert served.process.wait(30) == 1
    _forget_model_folders_of(served)
    assert not _processes_of(served), "the Python backend's stubs outlived their server"
    assert outcomes == [1] * len(events)
    stats = remote.stats
    assert stats.writes >= 10 and stats.fallbacks >= 1
    assert stats.writes + stats.fallbacks == len(events)
    for (nodes, edges), out in zip(events, outs, strict=True):
        assert torch.equal(out.score, _expected(local, nodes, edges))
    # Without a fallback: a clear error naming the server, and the output as it was.
    nodes, edges = events[0]
    untouched = EdgeScores.allocate(edges.size, zero=True)
    untouched.score.fill_(-1.0)
    before = bytes(untouched.buffer.numpy())
    with EdgeClassifier.remote(served.url, timeout=5, retries=1) as bare:
        with pytest.raises(RemoteUnavailableError, match=served.url):
            bare(nodes, edges, out=untouched)
    assert bytes(untouched.buffer.numpy()) == before
    remote.close()


@needs_triton
def test_a_model_the_server_does_not_serve_is_a_configuration_error(server: Served) -> None:
    nodes, edges = _event(5, 10, 9)
    with EdgeClassifier.remote(server.url, model_name="Other") as remote:
        with pytest.raises(RemoteConfigurationError, match="does not serve 'Other'"):
            remote(nodes, edges, out=EdgeScores.allocate(10))


def test_events_of_inputs_declared_same_n_must_agree(tmp_path: Path) -> None:
    """A Triton client sends each input as its own tensor: the server's loader checks `same n as`
    as a local call does, before anything runs (an eager model could broadcast a mask of one)."""
    from soagen.serving.events import EventError, EventInput, EventLoader
    from soagen.serving.wire import declared_order, wire_tensors
    from tests.helpers import REPO, generate_package, import_generated

    generate_package(REPO / "tests" / "peer" / "peer.soa", tmp_path, "pkg_events_same_n")
    module = import_generated(tmp_path, "pkg_events_same_n", "peer")
    specs = module.MaskedNet.INPUTS
    wires = wire_tensors(specs)
    loader = EventLoader(
        [EventInput(w.name, s, declared_order(w).dims) for s, w in zip(specs, wires, strict=True)],
        {"Particle": module.Particle, "Mask": module.Mask},
    )
    particles, mask = torch.rand(100, 3), torch.zeros(100, 3, dtype=torch.uint8)
    assert loader.event({"particles": particles, "mask": mask}).sizes == {
        "Particle": 100,
        "Mask": 100,
    }
    with pytest.raises(EventError, match=r"input 'mask' holds 1 elements and 'particles' 100"):
        loader.event({"particles": particles, "mask": mask[:1]})


def test_a_block_of_scalars_sent_per_element_is_stored_once_and_must_hold_one_value(
    generated_from_text: Callable[[str], ModuleType],
) -> None:
    """`soagen serve`'s wire carries a block of scalars (stride 0 along n) once per element, as
    the client's broadcast view reads: the loader stores one value, bit for bit (NaN too), and
    refuses copies that differ, which no collection could hold."""
    from soagen.serving.events import EventError, EventInput, EventLoader
    from soagen.serving.wire import declared_order, wire_tensors
    from tests.helpers import TRACK_SCHEMA

    module = generated_from_text(TRACK_SCHEMA)
    specs = module.TrackNet.INPUTS
    loader = EventLoader(
        [
            EventInput(w.name, s, declared_order(w).dims, w.scalars)
            for s, w in zip(specs, wire_tensors(specs), strict=True)
        ],
        {"Tracks": module.Tracks},
    )

    def load(n: int, bfield: torch.Tensor) -> typing.Any:
        event = loader.event(
            {"momentum": torch.ones(3, n), "cov": torch.ones(n, 3, 3), "bfield": bfield}
        )
        collections, _ = loader.load([event], torch.device("cpu"))
        return collections["Tracks"]

    tracks = load(4, torch.full((4,), float("nan")))
    assert tracks.size == 4 and bool(tracks.bfield.isnan())
    assert load(4, torch.full((4,), 3.8)).bfield.item() == pytest.approx(3.8)
    assert load(0, torch.empty(0)).size == 0  # no element carries it: nothing to store
    with pytest.raises(EventError, match="'bfield' is a block of scalars, one value per Tracks"):
        load(4, torch.tensor([3.8, 3.8, 3.8, 4.0]))
