"""Backends: what runs a model on its input tensors, placed on each device at its first call there.

An `nn.Module` runs in eval mode, put there when it is bound; a call while it is back in training
mode is refused. One backend object serves every device: `on(device)` builds the runner for a device
once (a copy of the module on that device, a TorchScript file loaded with `map_location`, a compiled
module, an AOTInductor package loaded for that device), caches it, and hands the same runner to
every later call, from any thread. Runners take the input tensors in schema order and return what the model
returns; `soagen.runtime.model` checks that before anything is written.

| kind        | model given as                              | runs                                  |
|-------------|---------------------------------------------|---------------------------------------|
| eager       | `nn.Module`                                 | the module (a copy per other device)  |
| torchscript | `torch.jit.ScriptModule`, `.pt` file        | `torch.jit.load(map_location=device)` |
| compile     | `nn.Module` (with `backend="compile"`)      | `torch.compile(module, dynamic=True)` |
| aot         | `.pt2` package made by `soagen compile`     | AOTInductor, see `soagen.runtime.aot` |
| onnxruntime | `.onnx` file                                | ONNX Runtime, see `soagen.runtime.onnx` |
"""

from __future__ import annotations

import abc
import copy
import io
import logging
import os
import threading
import time
import types
import typing
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from soagen.runtime.errors import CompiledModelMismatchError, ModelLoadError

if typing.TYPE_CHECKING:
    import torch

    from soagen.runtime.agreement import Disagreement
    from soagen.runtime.model import ModelBinding

KINDS = ("eager", "torchscript", "compile", "aot", "onnxruntime")

# INFO: a `torch.compile` runner's first call, which compiles (seconds to minutes) before it returns.
logger = logging.getLogger(__name__)

Runner = Callable[[Sequence["torch.Tensor"]], object]


class Backend(abc.ABC):
    """Runs one model; builds and caches a runner per device."""

    kind: typing.ClassVar[str]
    # Whether running it from Python could record autograd history: calls then run under
    # `torch.inference_mode()`, whose enter and exit cost a few microseconds per call.
    records_autograd: typing.ClassVar[bool] = True
    # Whether the runner takes the output blocks after the inputs and writes its results into
    # them (AOT packages built with `soagen compile --write-outputs`), returning nothing.
    writes_outputs: bool = False
    # Inputs the model is known to write into before it runs (recorded in AOT packages, whose
    # writes move no version counter): the binding refuses it unless inputs are protected.
    writes_inputs: tuple[str, ...] = ()
    # Whether the output blocks may lie over memory the inputs are read from: true where outputs
    # are written only after the model has run (the binding then skips its overlap check).
    outputs_may_overlap_inputs: bool = False
    # Whether the backend reads each input block's storage itself (an ONNX graph adapted to it):
    # a `contiguous` copy would only cost a copy.
    adapts_inputs: typing.ClassVar[bool] = False
    # Whether a write into an input moves its tensor's version counter (models run by ATen from
    # Python). Where none moves (a package's C++ runner, ONNX Runtime, which takes its inputs
    # read-only), the binding hands plain views and watches no counter.
    moves_version_counters: typing.ClassVar[bool] = True
    # Index inputs whose range the model checks itself, raising before it writes anything, each
    # with the input it indexes (CPU packages of `soagen compile`): a call plan leaves those to
    # it, and checks them in Python only to name the bad values once the model has refused them.
    index_ranges_checked: Mapping[str, str] = types.MappingProxyType({})

    def __init__(self, description: str) -> None:
        self.description = description
        self._runners: dict[torch.device, Runner] = {}
        self._lock = threading.Lock()

    @property
    def index_bounds(self) -> Mapping[str, str]:
        """Index inputs the model file declares, each with the input whose elements it indexes."""
        return {}

    @property
    def output_counts(self) -> Mapping[str, str]:
        """Outputs whose element count the model file fixes (where it `writes_outputs`): each
        with an input's name (as many elements as that input's collection) or a count. A server
        that allocates the output collections sizes them by it, and refuses a size given that
        differs."""
        return {}

    @property
    def suggested_output_counts(self) -> Mapping[str, str]:
        """Outputs whose element count the model file suggests without fixing it (names it
        gives its axes), as `output_counts` states them: a server sizes by them where nothing
        else says, and a size given overrides them."""
        return {}

    def on(self, device: torch.device) -> Runner:
        """The runner for `device`, built at the first call there; "cuda" means the current GPU."""
        if device.index is None and device.type == "cuda":
            import torch

            # Buffers always name their GPU: an unnamed one would place a second copy there.
            device = torch.device("cuda", torch.cuda.current_device())
        runner = self._runners.get(device)
        if runner is None:
            with self._lock:
                runner = self._runners.get(device)
                if runner is None:
                    runner = self.place(device)
                    self._runners[device] = runner
        return runner

    def on_fixed_inputs(self, device: torch.device, inputs: Sequence[torch.Tensor]) -> Runner:
        """The runner for `device`, for calls that always pass these very tensors (a call plan's
        arguments, whose shapes and strides never change): a backend may check them once here,
        raising as a call would, instead of at every call. By default `on(device)`."""
        return self.on(device)

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The devices this backend is placed on (built at a call there, not released since)."""
        with self._lock:  # a first call on another device may be adding one
            return tuple(self._runners)

    def release(self) -> None:
        """Drop every device's runner; a call in flight keeps its own until it returns, and the
        next call on a device builds one again."""
        with self._lock:
            self._runners.clear()

    @abc.abstractmethod
    def place(self, device: torch.device) -> Runner:
        """Build the runner for one device."""

    def __repr__(self) -> str:
        return f"<{self.kind} backend: {self.description}>"


class EagerBackend(Backend):
    kind = "eager"

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__(type(module).__name__)
        self.module = _for_inference(module)

    def place(self, device: torch.device) -> Runner:
        module, placed = self.module, _module_on(self.module, device)

        # `_in_eval_mode` and `_positional` in one frame: the runner of every eager call.
        def run(inputs: Sequence[torch.Tensor]) -> object:
            if module.training:
                raise _in_training_mode(module)
            return placed(*inputs)

        return run


class TorchScriptBackend(Backend):
    kind = "torchscript"

    def __init__(self, source: torch.jit.ScriptModule | Path) -> None:
        import torch

        if isinstance(source, Path):
            super().__init__(str(source))
            self.archive = source.read_bytes()
        else:
            super().__init__(type(source).__name__)
            # Saved once: each device loads its own copy with `map_location`, as from a file.
            saved = io.BytesIO()
            torch.jit.save(source, saved)
            self.archive = saved.getvalue()

    def place(self, device: torch.device) -> Runner:
        import torch

        module = torch.jit.load(io.BytesIO(self.archive), map_location=device)  # type: ignore[no-untyped-call]
        module.eval()
        return _positional(module)


class CompileBackend(Backend):
    """`torch.compile`: the first call on each device compiles (seconds), later calls reuse it.

    The first call of each placed runner, and each call that compiles a new graph (a recompile:
    a new pattern of sizes or strides), runs the eager module on the same inputs too and compares
    every output: a disagreement raises `CompiledModelMismatchError`, naming the output, the
    element counts and the difference, before anything is written. The graph stays in torch's
    cache, where later calls (of any binding of the same model class) would find it unchecked, so
    that device is refused from then on, `close()` included; with `fallback_to_eager` it warns once
    and runs that device eagerly instead. `graphs` records each compile and why it happened.
    """

    kind = "compile"

    def __init__(
        self,
        module: torch.nn.Module,
        options: Mapping[str, object] | None = None,
        *,
        binding: type[ModelBinding] | None = None,
        fallback_to_eager: bool = False,
    ) -> None:
        super().__init__(type(module).__name__)
        self.module = _for_inference(module)
        # dynamic=True: element counts (and the strides that follow them) vary from call to call.
        self.options: dict[str, object] = {"dynamic": True, **(options or {})}
        self.binding = binding
        self.fallback_to_eager = fallback_to_eager
        self._graphs: list[CompiledGraph] = []
        self._failures_seen: dict[object, int] = {}
        # Per device, kept across `release()`: a disagreement found there, once one was.
        self._disagreements: dict[torch.device, str] = {}

    @property
    def graphs(self) -> tuple[CompiledGraph, ...]:
        """Every compile seen during calls through this backend, in order (Dynamo counts graphs
        per process: another thread's compile at the same moment is seen too)."""
        with self._lock:
            return tuple(self._graphs)

    def __repr__(self) -> str:
        return f"<{self.kind} backend: {self.description}; {len(self.graphs)} graph(s) compiled>"

    def place(self, device: torch.device) -> Runner:
        import torch
        from torch._dynamo.utils import counters  # imported once: a call reads it twice

        _install_general_shapes()
        # `torch._dynamo.reset()` empties this list in place: each call checks ours is in it.
        registered = _registered_start_callbacks()
        module = _module_on(self.module, device)
        compiled = torch.compile(module, **self.options)  # type: ignore[call-overload]
        first_call = threading.Lock()
        warm = threading.Event()
        # Graphs torch cached before (another binding of the same class, a released runner) serve
        # this runner's first call without compiling: that call is checked all the same.
        checked = threading.Event()
        self._note_failures()

        def run(inputs: Sequence[torch.Tensor]) -> object:
            started: float | None = None  # when this call began compiling, if it is the first
            disagreement = self._disagreements.get(device)
            if disagreement is not None:
                if self.fallback_to_eager:
                    return module(*inputs)
                raise CompiledModelMismatchError(
                    f"{disagreement} (an earlier call on {device}; later calls there are refused: "
                    f"they would reuse that graph)"
                )
            if _start_general_shapes not in registered:
                _install_general_shapes()
            outermost = not _general_shapes.wanted
            _general_shapes.wanted = True
            try:
                # Graphs Dynamo has compiled in this process (every thread, every model).
                before = counters["stats"]["unique_graphs"]
                # Threads must not trace the same function at once: the first call compiles alone.
                if not warm.is_set():
                    with first_call:
                        if not warm.is_set():
                            started = self._log_first_call(device)
                        result = compiled(*inputs)
                        warm.set()
                else:
                    result = compiled(*inputs)
            finally:
                if outermost:
                    _general_shapes.wanted = False
                    # Dynamo's end callback may have run in another thread (see below).
                    _restore_shapes()
            # Another thread's compile may count too: this call is then checked needlessly.
            compiles = counters["stats"]["unique_graphs"] - before
            if not compiles and checked.is_set():
                return result
            checked.set()
            if compiles:
                self._record(device, inputs, compiles)
            # The inputs' bytes before the eager run: a model that writes its inputs changes them
            # there, as its compiled run did before, so the two read other values (the binding
            # reports that write). Nothing compiled runs again: Dynamo might run that eagerly.
            held = _held_bytes(inputs)
            reference = module(*inputs)
            try:
                self._check(inputs, result, reference)
            except CompiledModelMismatchError as error:
                if not _same_bytes(held, _held_bytes(inputs)):
                    self._log_done(device, started, "were not compared with (it writes its inputs)")
                    return result
                self._log_done(device, started, "disagree with")
                self._disagreements[device] = str(error)
                if not self.fallback_to_eager:
                    raise
                warnings.warn(
                    f"{error}; running eagerly on {device} from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return reference
            self._log_done(device, started, "agree with")
            return result

        return _in_eval_mode(self.module, run)

    def _model_name(self) -> str:
        if self.binding is None:
            return self.description
        return f"{self.binding.NAME} ({self.description})"

    def _log_first_call(self, device: torch.device) -> float:
        logger.info(
            "torch.compile: the first call of %s on %s compiles it (this can take tens of "
            "seconds), then checks its outputs against the eager model's",
            self._model_name(),
            device,
        )
        return time.perf_counter()

    def _log_done(self, device: torch.device, started: float | None, verdict: str) -> None:
        if started is not None:
            logger.info(
                "torch.compile: %s on %s finished in %.1f s (compiling, the first run and the "
                "check); its outputs %s the eager model's",
                self._model_name(),
                device,
                time.perf_counter() - started,
                verdict,
            )

    def _record(self, device: torch.device, inputs: Sequence[torch.Tensor], count: int) -> None:
        geometry = tuple(
            (name, tuple(tensor.shape), tuple(tensor.stride()))
            for name, tensor in zip(self._input_names(len(inputs)), inputs, strict=True)
        )
        with self._lock:
            reasons = self._note_failures()
            self._graphs.append(CompiledGraph(str(device), count, geometry, reasons))

    def _note_failures(self) -> tuple[str, ...]:
        """Dynamo's guard failures (why a graph no longer served a call) added since last asked."""
        try:
            from torch._dynamo.utils import guard_failures
        except ImportError:  # another torch: compiles are still counted, without reasons
            return ()
        reasons: list[str] = []
        for code, failures in list(guard_failures.items()):
            seen = self._failures_seen.get(code, 0)
            reasons += [str(failure).strip() for failure in failures[seen:]]
            self._failures_seen[code] = len(failures)
        return tuple(reasons)

    def _input_names(self, count: int) -> list[str]:
        if self.binding is None:
            return [f"input {i}" for i in range(count)]
        return [spec.name for spec in self.binding.INPUTS]

    def _check(self, inputs: Sequence[torch.Tensor], result: object, reference: object) -> None:
        """The new graph's results must agree with the eager module's on the same inputs."""
        found = self._disagreement(result, reference)
        if found is None:
            return
        name = self.binding.NAME if self.binding is not None else self.description
        raise CompiledModelMismatchError(
            f"{name}: the graph torch.compile made for this call disagrees with the eager model "
            f"on output {found.output!r} at {_element_counts(self.binding, inputs)}: "
            f"{found.detail}; nothing was written. Run it with backend='eager' (or 'torchscript', "
            f"or an AOT package, which `soagen compile` checks), or pass fallback_to_eager=True"
        )

    def _disagreement(self, result: object, reference: object) -> Disagreement | None:
        """How the compiled module's return value differs from the eager one's, output by output
        (in schema order with a binding); None where they agree."""
        from soagen.runtime.agreement import Disagreement, first_disagreement

        if self.binding is None:
            actual, expected = _as_tensors(result), _as_tensors(reference)
            labels = [f"output {i}" for i in range(len(expected))]
        else:
            from soagen.runtime.model import outputs_in_schema_order

            labels = [spec.name for spec in self.binding.OUTPUTS]
            actual = outputs_in_schema_order(self.binding, result)
            expected = outputs_in_schema_order(self.binding, reference)
        if len(actual) != len(expected):
            return Disagreement(
                "*", f"{len(actual)} tensors returned, the eager model {len(expected)}"
            )
        return first_disagreement(labels, actual, expected)


@dataclass(frozen=True, slots=True)
class CompiledGraph:
    """One compile a `CompileBackend` call started: on which device, how many graphs Dynamo made
    (several where the model breaks its graph), the inputs' (name, shape, strides) that call had,
    and Dynamo's reasons why the graphs compiled before did not serve it (none for the first)."""

    device: str
    graphs: int
    inputs: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    reasons: tuple[str, ...]


def _held_bytes(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each storage the inputs view, once each (inputs of one collection share one),
    as bytes: compared bitwise, so NaNs equal themselves."""
    import torch

    held: dict[int, torch.Tensor] = {}
    for tensor in inputs:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held:
            raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
            held[storage.data_ptr()] = raw.clone()
    return list(held.values())


def _same_bytes(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    import torch

    return len(before) == len(after) and all(
        torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )


def _as_tensors(result: object) -> list[torch.Tensor]:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, Mapping):
        return [value for _, value in sorted(result.items()) if isinstance(value, torch.Tensor)]
    if isinstance(result, (tuple, list)):
        return [value for value in result if isinstance(value, torch.Tensor)]
    return []


def _element_counts(binding: type[ModelBinding] | None, inputs: Sequence[torch.Tensor]) -> str:
    """`name n=N, ...` for each input with an element axis (shapes without a binding)."""
    if binding is None:
        return ", ".join(f"input {i} {list(t.shape)}" for i, t in enumerate(inputs))
    counts = [
        f"{spec.name} n={tensor.shape[spec.block.axes.index('n')]}"
        for spec, tensor in zip(binding.INPUTS, inputs, strict=True)
        if "n" in spec.block.axes
    ]
    return ", ".join(counts) or "no element axis"


class _GeneralShapes(threading.local):
    """Whether this thread is inside a `CompileBackend` call (so a compile it starts is ours), and
    the duck-shaping setting that compile replaced."""

    wanted = False
    replaced: bool | None = None


_general_shapes = _GeneralShapes()
_general_shapes_lock = threading.Lock()


def _registered_start_callbacks() -> Sequence[object]:
    """Dynamo's list of compile start callbacks (empty where this torch has none)."""
    try:
        from torch._dynamo.callback import callback_handler
    except (ImportError, AttributeError):
        return (_start_general_shapes,)  # nothing to register: never look again
    return callback_handler.start_callbacks


def _start_general_shapes(_: object) -> None:
    """Dynamo's compile start callback: duck shaping off for a compile a soagen call started."""
    if _general_shapes.wanted and _general_shapes.replaced is None:
        import torch.fx.experimental._config as fx_config

        _general_shapes.replaced = fx_config.use_duck_shape
        fx_config.use_duck_shape = False


def _end_general_shapes(_: object) -> None:
    _restore_shapes()


def _install_general_shapes() -> None:
    """Make every Dynamo compile started from a `CompileBackend` call trace without duck shaping.

    By default Dynamo gives sizes and strides that happen to be equal one symbol ("duck shaping").
    SoA views meet it by chance: a pitch equals n whenever n is a multiple of the alignment over the
    itemsize, pitches of two layouts coincide. Each such pattern compiled a graph of its own, up to
    torch's `recompile_limit`, after which new patterns ran eagerly. Without duck shaping, sizes
    keep symbols of their own. (Counts of 0 and 1 stay specialized: `backed_size_oblivious`, which
    would spare the n = 1 graph, made Inductor miscompile a real transformer.)

    The setting (per thread in torch 2.13) must not reach the user's own compiles in the same
    thread, and setting it around every call costs 7-21 us, so it is set by Dynamo's compile
    start callback, which runs in the compiling thread, when a thread-local flag says the compile
    comes from a soagen call, and put back by the end callback. Dynamo counts compiles in flight
    across threads and runs the callbacks only on the first start and the last end, so the end may
    run in another thread (a lazy backward compile there, say): the outermost soagen call puts the
    setting back too. When another thread's compile is in flight as ours starts, ours traces with
    Dynamo's defaults: more graphs, nothing wrong. `torch._dynamo.reset()` drops every callback:
    each call checks that ours are still registered (a list lookup) and registers them again.
    """
    try:
        from torch._dynamo.callback import callback_handler as handler
    except (ImportError, AttributeError):  # another torch: more graphs, nothing wrong
        return
    with _general_shapes_lock:
        if _start_general_shapes not in handler.start_callbacks:
            handler.register_start_callback(_start_general_shapes)
        if _end_general_shapes not in handler.end_callbacks:
            handler.register_end_callback(_end_general_shapes)


def _restore_shapes() -> None:
    """Put back the setting this thread's soagen compile replaced, if any."""
    replaced = _general_shapes.replaced
    if replaced is not None:
        import torch.fx.experimental._config as fx_config

        fx_config.use_duck_shape = replaced
        _general_shapes.replaced = None


def _for_inference(module: torch.nn.Module) -> torch.nn.Module:
    """The module in eval mode (dropout off, batch norms on their running statistics), as
    `soagen compile` exports it and TorchScript files are run: set once, when it is bound."""
    return module.eval()


def _in_eval_mode(module: torch.nn.Module, run: Runner) -> Runner:
    """`run`, refused while `module` is back in training mode (`module.train()` after binding it,
    in a loop that trains and validates): its dropout would make every call's results differ."""

    def run_in_eval_mode(inputs: Sequence[torch.Tensor]) -> object:
        if module.training:
            raise _in_training_mode(module)
        return run(inputs)

    return run_in_eval_mode


def _in_training_mode(module: torch.nn.Module) -> ModelLoadError:
    return ModelLoadError(
        f"{type(module).__name__} is in training mode (.train() was called after it was bound), "
        f"where dropout and batch norms change its results; call .eval() on it before running it "
        f"through soagen"
    )


def _positional(module: Callable[..., object]) -> Runner:
    """Inputs go to `forward` by position, in schema order: its argument names may differ."""

    def run(inputs: Sequence[torch.Tensor]) -> object:
        return module(*inputs)

    return run


def _module_on(module: torch.nn.Module, device: torch.device) -> Callable[..., object]:
    """The module itself where all its tensors already are on `device`, else a copy moved there."""
    tensors = [*module.parameters(), *module.buffers()]
    if all(tensor.device == device for tensor in tensors):
        return module
    return copy.deepcopy(module).to(device)


def load_backend(
    model: object,
    *,
    kind: str | None,
    binding: type[ModelBinding],
    fallback_to_eager: bool = False,
    options: Mapping[str, object] | None = None,
) -> Backend:
    """The backend for a model object or file; `kind` forces one of `KINDS`. `fallback_to_eager`
    is for "compile" (see `CompileBackend`); `options` for "onnxruntime" (`OnnxBackend`'s keyword
    arguments)."""
    if fallback_to_eager and kind != "compile":
        raise ModelLoadError(
            f"fallback_to_eager is for backend='compile' (whose graphs are checked against the "
            f"eager model as they compile); got backend={kind!r}"
        )
    if options and not (
        kind == "onnxruntime"
        or (kind is None and isinstance(model, (str, os.PathLike)) and _is_onnx(Path(model)))
    ):
        raise ModelLoadError(
            f"backend_options are for ONNX models (backend='onnxruntime'); got backend={kind!r}"
        )
    if isinstance(model, Backend) and kind is None:
        return model  # made by the caller: a remote binding's, say (`soagen.serving.client`)
    if kind is not None and kind not in KINDS:
        raise ModelLoadError(f"backend must be one of {', '.join(KINDS)}; got {kind!r}")
    if isinstance(model, (str, os.PathLike)):
        return _from_file(Path(model), kind, binding, options or {})
    import torch

    if isinstance(model, torch.jit.ScriptModule):
        if kind not in (None, "torchscript"):
            raise ModelLoadError(
                f"a TorchScript module runs with backend='torchscript', not {kind!r}"
            )
        return TorchScriptBackend(model)
    if isinstance(model, torch.nn.Module):
        if kind in (None, "eager"):
            return EagerBackend(model)
        if kind == "compile":
            return CompileBackend(model, binding=binding, fallback_to_eager=fallback_to_eager)
        raise ModelLoadError(
            f"backend={kind!r} needs a model file; for an nn.Module use 'eager' or 'compile'"
            + (", or build a .pt2 with `soagen compile`" if kind == "aot" else "")
            + (", or export it with torch.onnx.export" if kind == "onnxruntime" else "")
        )
    raise ModelLoadError(
        f"{binding.NAME}: a model is an nn.Module, a TorchScript module or a path to a .pt, "
        f".pt2 or .onnx file; got {type(model).__name__}"
    )


def _from_file(
    path: Path, kind: str | None, binding: type[ModelBinding], options: Mapping[str, object]
) -> Backend:
    if not path.is_file():
        raise ModelLoadError(f"model file {str(path)!r} does not exist or is not a file")
    found = file_kind(path)
    if kind is not None and kind != found:
        raise ModelLoadError(f"{path} is {FILE_KINDS[found]}; it cannot run with backend={kind!r}")
    if found == "aot":
        from soagen.runtime.aot import AotBackend

        return AotBackend(path, binding)
    if found == "onnxruntime":
        from soagen.runtime.onnx import OnnxBackend

        try:
            return OnnxBackend(path, binding, **options)  # type: ignore[arg-type]
        except TypeError as error:  # an option OnnxBackend does not take
            raise ModelLoadError(f"backend_options: {error}") from None
    return TorchScriptBackend(path)


# What each `file_kind` is, for messages.
FILE_KINDS = {
    "aot": "an AOTInductor package (.pt2)",
    "torchscript": "a TorchScript file (.pt)",
    "onnxruntime": "an ONNX model (.onnx)",
}


def _is_onnx(path: Path) -> bool:
    """Whether the file starts as a serialized ONNX ModelProto does: protobuf writes fields in
    number order, and every exporter sets field 1, `ir_version` (a small varint). `onnx.load`
    then reads the whole file."""
    try:
        with path.open("rb") as file:
            head = file.read(2)
    except OSError:
        return False
    return len(head) == 2 and head[0] == 0x08 and 0 < head[1] < 0x80


def file_kind(path: Path) -> str:
    """ "torchscript" or "aot", from the archive's entries (the suffix alone proves nothing), or
    "onnxruntime" for an ONNX model."""
    if _is_onnx(path):
        return "onnxruntime"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        raise ModelLoadError(
            f"{path} is not a TorchScript (.pt) or AOTInductor (.pt2) archive, nor an ONNX model: "
            f"{error}"
        ) from None
    if any("/aotinductor/" in name or name.startswith("aotinductor/") for name in names):
        return "aot"
    if any(name.endswith("/constants.pkl") for name in names) and any(
        "/code/" in name for name in names
    ):
        return "torchscript"
    if any(name.endswith("/data.pkl") for name in names):
        raise ModelLoadError(
            f"{path} holds a pickled object (torch.save), not a TorchScript module or an "
            f"AOTInductor package: build the module in Python and pass it, save it with "
            f"torch.jit.save, or package it with `soagen compile`"
        )
    raise ModelLoadError(f"{path} is a zip archive but neither TorchScript nor AOTInductor")
