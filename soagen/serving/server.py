"""`soagen serve`: a real Triton Inference Server (NVIDIA PyTriton) for a generated model binding.

PyTriton (`pip install 'soagen[serve]'`, pinned to nvidia-pytriton 0.7.0) ships `tritonserver` and its
Python backend and calls a Python function with each batch of requests; that function runs soagen's
runtime, so a served model is checked exactly as a local one is (index ranges, inputs left
unmodified, output dtypes and extents).

How requests batch. One request is one event: every input block of the binding, each in its wire
form (`soagen.serving.wire`: storage order, a leading batch axis of 1). An event's element counts are
its own, and one model (the example GNN) mixes several of them (nodes, edges) and integer inputs that
index another input's rows. Concatenating events along Triton's batch axis, as PyTriton's `@batch`
does, would need equal element counts, and gluing element axes together would need index inputs
renumbered and outputs split by counts the server cannot know. So the inputs allow *ragged*
batches: Triton's dynamic batcher gathers concurrent events of any sizes (from many jobs, up to
`max_batch_size` events, waiting at most `max_queue_delay_us` for more) into one execution, and the
server runs the model once per event of that execution, on the event's own blocks. Triton's
statistics then count fewer executions than inferences. Running merged events as one model call
(graph batching, faster on a GPU) is for later: it needs the schema to say how an output's elements
follow from the inputs'.

Per event, the server rebuilds the input collections (one allocation and one copy of each block,
from PyTriton's request memory into a buffer with the layout's pitches), so the model sees exactly
the strides a local call gives it (AOTInductor packages rely on them) and results match local
execution bit for bit on the same machine and thread count. PyTriton fails a whole execution when
its function raises, so an event that fails (a wrong element count, an index out of range) among
others is answered with placeholder outputs and its error in the extra output `soagen_error`
(`wire.ERROR_OUTPUT`), which soagen's client raises as that call's `RemoteInferenceError`; the other
events of the execution keep their results. An event alone in its execution fails as a Triton error.

Serving rules: loopback (127.0.0.1) unless told otherwise; PyTriton's workspace in a temporary
folder, not ~/.cache; the shared-memory, statistics and repository APIs guarded by an access token
(PyTriton's `TritonSecurityConfig`): give clients the token (`token_file`) to let them register
shared memory; inference needs none. With an interpreter whose `libpython` is not on the loader's
path (pyenv), the Python backend's stub would load the system's libpython and fail
(`'_thread.RLock' object has no attribute '_recursion_count'`): the server puts this interpreter's
`lib` folder first on `LD_LIBRARY_PATH`. `tritonserver` waits at most `exit_timeout_s` for requests
in flight when stopped.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import secrets
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from soagen.runtime.collection import Collection
from soagen.runtime.cpu import ensure_cpu_settings, ensure_malloc_tuning
from soagen.runtime.model import ModelBinding
from soagen.serving.errors import ServeError
from soagen.serving.events import (
    EventError,
    EventInput,
    EventLoader,
    OutputSizeError,
    RecordedSizeError,
    binding_output_sizes,
    writes_over_inputs,
)
from soagen.serving.wire import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_DELAY_US,
    ERROR_OUTPUT,
    WireTensor,
    declared_order,
    dims_match,
    wire_tensors,
)

if typing.TYPE_CHECKING:
    import torch
    from numpy.typing import NDArray

_LOG = logging.getLogger("soagen.serve")

PYTRITON_VERSION = "0.7.0"
DEFAULT_GRPC_PORT = 8001
DEFAULT_HTTP_PORT = 8000
DEFAULT_EXIT_TIMEOUT_S = 3


@dataclass(frozen=True, slots=True)
class LoadedBinding:
    """A model binding class with the layout classes its blocks belong to."""

    binding: type[ModelBinding]
    layouts: Mapping[str, type[Collection]]


def load_binding(source: str | os.PathLike[str], model_name: str) -> LoadedBinding:
    """The binding class `model_name` of a schema (`.soa`, generated into a throwaway package), of a
    generated module file (`.py`) or of an importable module (`generated.gnn`)."""
    text = os.fspath(source)
    if text.endswith(".soa"):
        from soagen.build.model import generated_binding

        if not Path(text).is_file():
            raise ServeError(f"schema {text!r} does not exist", usage=True)
        workdir = tempfile.mkdtemp(prefix="soagen-serve-schema-")
        try:
            binding, layouts = generated_binding(Path(text), model_name, Path(workdir))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return LoadedBinding(binding, layouts)
    module = _import_module(text)
    found = getattr(module, model_name, None)
    if not (isinstance(found, type) and issubclass(found, ModelBinding)):
        known = sorted(
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and issubclass(value, ModelBinding)
            and value is not ModelBinding
        )
        raise ServeError(
            f"{text} has no model binding {model_name!r}"
            + (f"; its models are {', '.join(known)}" if known else ""),
            usage=True,
        )
    from soagen.build.model import layout_classes

    return LoadedBinding(found, layout_classes(module))


def _import_module(text: str) -> ModuleType:
    if text.endswith(".py"):
        path = Path(text)
        if not path.is_file():
            raise ServeError(f"module file {text!r} does not exist", usage=True)
        # A generated module imports its siblings relatively: import it as part of its folder.
        package_dir = path.resolve().parent
        sys.path.insert(0, str(package_dir.parent))
        try:
            if (package_dir / "__init__.py").is_file():
                return importlib.import_module(f"{package_dir.name}.{path.stem}")
            sys.path.insert(0, str(package_dir))
            try:
                return importlib.import_module(path.stem)
            finally:
                sys.path.remove(str(package_dir))
        finally:
            sys.path.remove(str(package_dir.parent))
    try:
        return importlib.import_module(text)
    except ImportError as error:
        raise ServeError(
            f"cannot import {text!r} ({error}): give a .soa schema, a generated .py file or an "
            f"importable module name",
            usage=True,
        ) from None


def build_binding(
    loaded: LoadedBinding,
    *,
    factory: str | None = None,
    model_file: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    index_bounds: Mapping[str, str] | None = None,
) -> ModelBinding:
    """An instance of the binding over the model: built by `factory` ("file.py:function", an
    nn.Module), or loaded from `model_file` (TorchScript `.pt`, AOTInductor `.pt2`, ONNX
    `.onnx`)."""
    if (factory is None) == (model_file is None):
        raise ServeError("give the model either as a factory or as a model file", usage=True)
    from soagen.build.model import build_model, resolve_index_bounds, torch_device

    target_device = torch_device(device)
    if factory is not None:
        module, factory_module = build_model(factory, target_device)
        bounds = resolve_index_bounds(loaded.binding, index_bounds, factory_module)
        return loaded.binding(module, index_bounds=bounds)
    assert model_file is not None
    from soagen.runtime.errors import SoaRuntimeError

    try:
        binding = loaded.binding(os.fspath(model_file), index_bounds=index_bounds)
    except SoaRuntimeError as error:
        raise ServeError(str(error), usage=True) from None
    return binding


class EventRunner:
    """PyTriton's inference function: runs the binding once per event of a Triton execution."""

    def __init__(
        self,
        binding: ModelBinding,
        layouts: Mapping[str, type[Collection]],
        device: str,
        output_sizes: Mapping[str, str] | None = None,
    ) -> None:
        import torch

        cls = type(binding)
        self.binding = binding
        self.device = torch.device(device)
        self.inputs = wire_tensors(cls.INPUTS)
        self.outputs = wire_tensors(cls.OUTPUTS)
        # A package built with --write-outputs stores its results into output blocks: the server
        # allocates their collections per event, with the element counts `output_sizes` gives.
        sizes = _output_sizes(binding, output_sizes or {})
        self._output_sizes = (
            None
            if sizes is None
            else [(spec.block.layout, sizes[spec.name]) for spec in cls.OUTPUTS]
        )
        needed = {wire.layout for wire in self.inputs}
        if sizes is not None:
            needed |= {spec.block.layout for spec in cls.OUTPUTS}
        missing = sorted(needed - set(layouts))
        if missing:
            raise ServeError(f"no layout class for {', '.join(missing)} among the loaded modules")
        self.layouts = dict(layouts)
        # On CPU the binding checks index inputs, and its IndexRangeError reaches the client. On
        # a GPU its check is a device-side assert, which would leave this process's CUDA context
        # unusable for every later request: events are checked on the host first.
        self.loader = EventLoader(
            [
                EventInput(wire.name, spec, declared_order(wire).dims, wire.scalars)
                for spec, wire in zip(cls.INPUTS, self.inputs, strict=True)
            ],
            self.layouts,
            binding.index_bounds if self.device.type != "cpu" else None,
        )
        from soagen.runtime.buffers import TORCH_DTYPES

        # What every event needs of the binding, worked out once.
        self._input_plan = [
            (spec.name, wire, wire.inverse)
            for spec, wire in zip(cls.INPUTS, self.inputs, strict=True)
        ]
        self._output_plan = [
            (wire, TORCH_DTYPES[wire.dtype], declared_order(wire).dims) for wire in self.outputs
        ]
        import numpy as np

        self._no_error = np.array([[b""]], dtype=np.bytes_)  # shared: responses are only read

    def __call__(self, requests: Sequence[typing.Any]) -> list[dict[str, NDArray[typing.Any]]]:
        answers = []
        for request in requests:
            try:
                answer = self.run_event(request.data)
            except Exception as error:
                if len(requests) == 1:
                    raise  # alone in its execution: a Triton error, which every client reads
                # Raising would fail every event of the execution: answer this one with its error.
                answer = self.failed_event(error)
            else:
                answer[ERROR_OUTPUT] = self._no_error
            answers.append(answer)
        return answers

    def failed_event(self, error: Exception) -> dict[str, NDArray[typing.Any]]:
        """The answer to an event that raised `error`: placeholder outputs of one element (PyTriton
        cannot send empty arrays), and the error's type and message in `ERROR_OUTPUT`."""
        import numpy as np

        _LOG.warning("an event failed among others batched with it: %s", error)
        answer = {
            wire.name: np.zeros(
                (1, *(1 if size == -1 else size for size in wire.dims)), dtype=wire.numpy_dtype
            )
            for wire in self.outputs
        }
        message = f"{type(error).__name__}: {error}".encode(errors="replace")
        answer[ERROR_OUTPUT] = np.array([[message]], dtype=np.bytes_)
        return answer

    def run_event(
        self, arrays: Mapping[str, NDArray[typing.Any]]
    ) -> dict[str, NDArray[typing.Any]]:
        """One event: wire arrays in, wire arrays out (each with the batch axis of 1)."""
        from soagen.runtime.buffers import contiguous_copy, numpy_of, tensor_of

        tensors = {}
        for name, wire, inverse in self._input_plan:
            array = arrays[wire.name]
            problem = wire.shape_problem(array.shape)
            if problem is not None:
                raise EventError(f"input {wire.name!r} {problem}: one event per request")
            tensors[name] = tensor_of(array[0], wire.dtype).permute(inverse)
        event = self.loader.event(tensors)
        sizes = self._output_sizes
        if sizes is None:
            collections, _ = self.loader.load([event], self.device)
            inputs = {item.spec.name: collections[item.layout] for item in self.loader.inputs}
            results = self.binding._evaluate(inputs, self.device, None)
        else:
            counts, _ = self.loader.counts(event, sizes)
            collections, _ = self.loader.load([event], self.device, [counts])
            inputs = {item.spec.name: collections[item.layout] for item in self.loader.inputs}
            outputs = {
                spec.name: collections[spec.block.layout] for spec in type(self.binding).OUTPUTS
            }
            self.binding.run(inputs, outputs)
            results = [outputs[spec.name].block(spec.block) for spec in type(self.binding).OUTPUTS]
        answer: dict[str, NDArray[typing.Any]] = {}
        for (wire, dtype, dims), result in zip(self._output_plan, results, strict=True):
            problem = _output_problem(wire, dtype, dims, result)
            if problem is not None:
                name = type(self.binding).NAME
                raise ValueError(f"{name} output {wire.name!r} {problem}; nothing was sent")
            answer[wire.name] = numpy_of(contiguous_copy(result.permute(wire.order)).cpu())[None]
        return answer


def _output_sizes(
    binding: ModelBinding, given: Mapping[str, str]
) -> dict[str, dict[str, object]] | None:
    """Per output, how many elements its collection gets per event (`events.output_sizes`), for
    a model that stores into its output blocks (a package built with --write-outputs, an ONNX
    model); None for one that returns its outputs. Where no size is given, the model file's
    counts (`Backend.output_counts`, else `Backend.suggested_output_counts`); a given size that
    differs from the file's fixed ones is refused."""
    cls = type(binding)
    backend = binding._backend
    if not backend.writes_outputs:
        if given:
            raise ServeError(
                f"output sizes (--output-size) are for a model that stores into its output "
                f"blocks (a package built with --write-outputs, an ONNX model), whose "
                f"collections the server allocates; {cls.NAME}'s model returns its outputs, "
                f"which have the sizes it gives them",
                usage=True,
            )
        return None
    if not backend.outputs_may_overlap_inputs:
        problem = writes_over_inputs(cls)
        if problem is not None:
            raise ServeError(f"{problem}; serve a package that returns its outputs", usage=True)
    texts = {name: str(size) for name, size in given.items()}  # the Python API's ints
    try:
        return binding_output_sizes(
            cls, texts, backend.output_counts, backend.suggested_output_counts
        )
    except RecordedSizeError as error:
        raise ServeError(f"{error} ({backend.description})", usage=True) from None
    except OutputSizeError as error:
        raise ServeError(str(error), usage=True) from None


def _output_problem(
    wire: WireTensor, dtype: torch.dtype, dims: tuple[int, ...], result: torch.Tensor
) -> str | None:
    """Why a model's output does not fit its binding (`dtype`, declared-order `dims`), or None."""
    if result.dtype != dtype:
        return f"has dtype {result.dtype}, the schema declares {wire.dtype}"
    if result.dim() != len(wire.axes):
        return f"has {result.dim()} axes, the schema declares [{', '.join(wire.axes)}]"
    if not dims_match(tuple(result.shape), dims):
        return f"has shape {list(result.shape)}, the schema declares [{', '.join(wire.axes)}]"
    return None


class Server:
    """A running Triton server serving one model binding. `stop()` (or leaving the `with` block)
    stops it and removes its workspace."""

    def __init__(
        self,
        triton: typing.Any,
        runner: EventRunner,
        *,
        model_name: str,
        host: str,
        grpc_port: int,
        http_port: int,
        access_token: str,
        workspace: Path,
    ) -> None:
        self._triton = triton
        self.runner = runner
        self.model_name = model_name
        self.host = host
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.access_token = access_token
        self.workspace = workspace
        self._stopped = False
        self._lock = threading.Lock()
        # The Python backend's shared-memory regions: tritonserver removes them unless it is killed.
        config = getattr(triton, "_python_backend_config", None)
        prefix = config["shm-region-prefix-name"] if config is not None else None
        self._backend_regions = str(prefix) if prefix else None

    @property
    def grpc_url(self) -> str:
        """`host:port` of the gRPC endpoint, as `Model.remote(url)` takes it."""
        return f"{_url_host(self.host)}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.http_port}"

    def is_alive(self) -> bool:
        return not self._stopped and bool(self._triton.is_alive())

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            self._triton.stop()
        finally:
            if not self._triton.is_alive():
                _end_orphaned_stubs(self.workspace)
                if self._backend_regions:
                    for path in Path("/dev/shm").glob(f"{self._backend_regions}*"):
                        with contextlib.suppress(OSError):
                            path.unlink()
            shutil.rmtree(self.workspace, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _end_orphaned_stubs(workspace: Path) -> None:
    """End the Python backend's stub processes of a tritonserver that died without stopping them
    (killed, say): they run the stub copied into this server's workspace, which names them."""
    marker = os.fsencode(workspace) + b"/"
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if command.startswith(marker):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def serve(
    source: str | os.PathLike[str],
    model_name: str,
    *,
    factory: str | None = None,
    model_file: str | os.PathLike[str] | None = None,
    binding: ModelBinding | None = None,
    host: str = "127.0.0.1",
    grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int = DEFAULT_HTTP_PORT,
    metrics_port: int | None = None,
    device: str = "cpu",
    index_bounds: Mapping[str, str] | None = None,
    output_sizes: Mapping[str, str] | None = None,
    triton_model_name: str | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_queue_delay_us: int = DEFAULT_MAX_QUEUE_DELAY_US,
    access_token: str | None = None,
    exit_timeout_s: int = DEFAULT_EXIT_TIMEOUT_S,
    log_file: str | os.PathLike[str] | None = None,
) -> Server:
    """Start a Triton server for binding `model_name` of `source` and return once it serves.

    `source`: a `.soa` schema, a generated module file or an importable module. The model: built by
    `factory` ("file.py:function", returning an nn.Module), loaded from `model_file` (`.pt`,
    `.pt2`, `.onnx`), or given as `binding` (an instance of the binding class, for tests and
    notebooks). The model is served under `triton_model_name` (default: the binding's name) on
    `host` (loopback by default) at `grpc_port` and `http_port` (metrics only with
    `metrics_port`). `access_token` guards the shared-memory and statistics APIs (default: a
    random one, `Server.access_token`). A package built with --write-outputs, or an ONNX model,
    stores into output collections the server allocates per event:
    `output_sizes` (output -> input name or count, `--output-size`) says how many elements each
    gets where its layout is its own, before what the model file records and the one input
    layout (`events.output_sizes`).

    What cannot work raises a `soagen.build.errors.CommandError`: a `ServeError`, or one of the
    `soagen.build.model` helpers it shares with `soagen compile` (a factory that fails, say).
    """
    _check_batching(max_batch_size, max_queue_delay_us)
    loaded = load_binding(source, model_name)
    if binding is None:
        binding = build_binding(
            loaded,
            factory=factory,
            model_file=model_file,
            device=device,
            index_bounds=index_bounds,
        )
    elif not isinstance(binding, loaded.binding) and type(binding).NAME != model_name:
        raise ServeError(f"binding= is a {type(binding).NAME}, not a {model_name}", usage=True)

    if device == "cpu":
        ensure_cpu_settings()
    # PyTriton runs the model in a thread of its own: tune malloc before it starts (the tuning
    # keeps threads on the main arena; the GNN at 1e6 edges took 600-800 ms per event, not 200).
    ensure_malloc_tuning()
    runner = EventRunner(binding, loaded.layouts, device, output_sizes)
    served_name = triton_model_name or model_name
    access_token = access_token or secrets.token_urlsafe(32)
    import numpy as np

    triton_module = _pytriton()
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    config = triton_module.TritonConfig(
        grpc_address=host,
        grpc_port=grpc_port,
        http_address=host,
        http_port=http_port,
        allow_metrics=metrics_port is not None,
        metrics_address=host if metrics_port is not None else None,
        metrics_port=metrics_port,
        exit_timeout_secs=exit_timeout_s,
        log_file=Path(log_file) if log_file is not None else None,
    )
    root = _workspace_root(served_name)
    workspace = root / "pytriton"
    triton = triton_module.Triton(
        config=config,
        workspace=workspace,
        security_config=triton_module.TritonSecurityConfig(access_token=access_token),
    )
    try:

        def tensors(wires: Sequence[WireTensor]) -> list[typing.Any]:
            return [
                Tensor(name=wire.name, dtype=np.dtype(wire.numpy_dtype), shape=wire.dims)
                for wire in wires
            ]

        triton.bind(
            model_name=served_name,
            infer_func=runner,
            inputs=tensors(runner.inputs),
            outputs=[
                *tensors(runner.outputs),
                Tensor(name=ERROR_OUTPUT, dtype=np.bytes_, shape=(1,)),
            ],
            config=ModelConfig(
                batching=True,
                max_batch_size=max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=max_queue_delay_us),
            ),
            strict=False,
        )
        _allow_ragged_batches(triton, served_name)
        with _interpreter_libraries_first():
            triton.run()
    except BaseException:
        with contextlib.suppress(Exception):
            triton.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return Server(
        triton,
        runner,
        model_name=served_name,
        host=host,
        grpc_port=grpc_port,
        http_port=http_port,
        access_token=access_token,
        workspace=root,
    )


def _check_batching(max_batch_size: int, max_queue_delay_us: int) -> None:
    for name, value, low in (
        ("max_batch_size", max_batch_size, 1),
        ("max_queue_delay_us", max_queue_delay_us, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ServeError(f"{name} must be an integer >= {low}, got {value!r}", usage=True)


def _pytriton() -> ModuleType:
    try:
        import pytriton.triton
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] not in ("pytriton", "tritonclient"):
            raise
        raise ServeError(
            f"soagen serve needs NVIDIA PyTriton: pip install 'soagen[serve]' "
            f"(nvidia-pytriton=={PYTRITON_VERSION}; Linux x86-64, glibc >= 2.35)",
            usage=True,
        ) from None
    return typing.cast(ModuleType, pytriton.triton)


# Longest path of a Unix socket (sun_path holds 108 bytes with the terminating zero).
_SOCKET_PATH_LIMIT = 107


def _workspace_root(model_name: str) -> Path:
    """A new temporary folder for PyTriton's workspace, whose Unix sockets
    (`pytriton/NAME_0_0-server.sock`) must fit the socket path limit: under TMPDIR, or /tmp when
    TMPDIR is too deep for them."""
    socket_name = f"pytriton/{model_name}_0_0-server.sock"
    for parent in (None, "/tmp"):
        if parent is not None and not Path(parent).is_dir():
            continue
        root = Path(tempfile.mkdtemp(prefix="soagen-serve-", dir=parent))
        if len(os.fsencode(root / socket_name)) <= _SOCKET_PATH_LIMIT:
            return root
        root.rmdir()
    raise ServeError(
        f"the model name {model_name!r} is too long for PyTriton's socket paths "
        f"({_SOCKET_PATH_LIMIT} bytes at most): serve it under a shorter --triton-name",
        usage=True,
    )


def _allow_ragged_batches(triton: typing.Any, model_name: str) -> None:
    """Mark every input `allow_ragged_batch`, so events of different element counts batch together.

    PyTriton's `Tensor` has no such field; its `Model.get_model_config()` makes the configuration
    sent to Triton at load time, so the bound model's method is wrapped (PyTriton 0.7.0's layout).
    """
    models = getattr(getattr(triton, "_model_manager", None), "models", None)
    found = [model for model in models or () if getattr(model, "model_name", None) == model_name]
    if len(found) != 1 or not callable(getattr(found[0], "get_model_config", None)):
        raise ServeError(
            f"cannot enable ragged batches with this PyTriton; soagen serve needs "
            f"nvidia-pytriton=={PYTRITON_VERSION}"
        )
    model = found[0]
    make_config: Callable[[], dict[str, typing.Any]] = model.get_model_config

    def ragged_config() -> dict[str, typing.Any]:
        config = make_config()
        for entry in config.get("input", []):
            entry["allow_ragged_batch"] = True
        return config

    model.get_model_config = ragged_config


def interpreter_library_path(current: str | None) -> str | None:
    """`LD_LIBRARY_PATH` (`current`) with this interpreter's `lib` folder first, so that the Python
    backend's stub, which tritonserver starts, loads the same libpython as this process (pyenv)."""
    folder = sysconfig.get_config_var("LIBDIR")
    if not folder or not Path(folder).is_dir():
        return current
    return str(folder) + (os.pathsep + current if current else "")


@contextlib.contextmanager
def _interpreter_libraries_first() -> Iterator[None]:
    """`interpreter_library_path` while tritonserver starts (it copies the environment then)."""
    before = os.environ.get("LD_LIBRARY_PATH")
    path = interpreter_library_path(before)
    if path is None:
        yield
        return
    os.environ["LD_LIBRARY_PATH"] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = before


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def write_token(path: str | os.PathLike[str], token: str) -> None:
    """Write the access token to `path`, readable by its owner only."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    os.replace(temporary, target)


def wait_forever(server: Server, stop: threading.Event, poll_s: float = 0.5) -> bool:
    """Block until `stop` is set (True) or the server dies (False)."""
    while not stop.wait(poll_s):
        if not server.is_alive():
            return False
    return True


__all__ = [
    "EventRunner",
    "LoadedBinding",
    "Server",
    "build_binding",
    "interpreter_library_path",
    "load_binding",
    "serve",
    "write_token",
]
