"""ONNX models run by ONNX Runtime on SoA blocks where they lie: IO binding, no host copies.

A user's ONNX model takes contiguous tensors in each binding's declared axis order (`[n, c]`,
`[n, 17, 32]`, ...). SoA blocks are rows of values at a pitch instead: a block of C columns (of k
coefficient columns each, for array columns) is R = C * k rows of `pitch` values, padding included,
the element axis running along each row. At load the graph is adapted once per binding (the file is
left as it is; the adapted model is cached per file and binding):

- each input takes the block's storage as it lies in the buffer, a dense `[R, pitch]` tensor bound
  at the buffer's own address; the graph slices each row to the call's elements (where their
  values start and stop in the row come in two `[1]` int64 inputs of their own,
  `soagen.<binding>.start` and `.stop`), reshapes the rows to the block's storage dimensions and transposes
  them into the declared order. A packed column's row holds k values per element, and a block of
  scalars (one value per collection, stride 0 along n) is expanded to the element count.
- each output is transposed to storage order and split into its rows, one graph output per row,
  bound at that row's address in the output block: ONNX Runtime writes exactly the block's values,
  neither the padding nor the neighbouring elements of a sliced collection
  (`outputs="in_place"`); or the model's own outputs are written into one scratch tensor each and
  copied into the blocks after the run (`outputs="staged"`, the default).

The first call on each device, and each call whose input geometry takes another path through the
adaptation (a slice whose rows are bound from before its first element), also runs the original
model on contiguous copies of the same inputs and compares: a disagreement raises
`CompiledModelMismatchError` and puts the output blocks back as they were.

When a failed call leaves partial results: with `outputs="in_place"` ONNX Runtime writes each output
row as the node producing it runs, so an error raised by a later node (an allocation failure, a
kernel's own error, an output whose shape the model computes wrongly) leaves the rows written before
it changed and the rest as they were. soagen checks every shape, dtype and index range it can before
the run, so that is what is left. With `outputs="staged"` a failed call writes nothing, at the cost of
one copy of the outputs per call. Staged is the default: for a tagger (544 input values and 10
output values per element) the two took the same time within the noise of repeated runs (README,
"ONNX models"), and staged keeps the torch backends' promise that a failed call writes nothing
(and lets an output lie over an input).

Needs the `onnx` and `onnxruntime` packages (`pip install 'soagen[onnx]'`), imported when an ONNX
model is first loaded.
"""

from __future__ import annotations

import hashlib
import threading
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

from soagen.runtime.backends import Backend, Runner
from soagen.runtime.errors import BindingError, CompiledModelMismatchError, ModelLoadError
from soagen.runtime.onnx_graph import (
    METADATA_FORMAT,
    METADATA_KEY,
    ONNX_ELEMENT_TYPES,
    BlockStorage,
    _gaps,
    _Port,
    _ports,
    adapt,
    block_storage,
    counts_from_symbols,
    match_ports,
    range_inputs,
    row_outputs,
    storage_file_outputs,
)

if typing.TYPE_CHECKING:
    import torch

    from soagen.runtime.model import ModelBinding

# The extra that installs what this module needs.
EXTRA = "onnx"

# Where outputs are written: the graph's rows bound in the output blocks, or scratch tensors copied.
OUTPUT_MODES = ("in_place", "staged")


def import_onnx() -> tuple[typing.Any, typing.Any]:
    """The `onnx` and `onnxruntime` modules, or a ModelLoadError naming the extra to install."""
    try:
        import onnx
        import onnxruntime
    except ImportError as error:
        raise ModelLoadError(
            f"ONNX models need the onnx and onnxruntime packages ({error}); install them with "
            f"pip install 'soagen[{EXTRA}]'"
        ) from None
    return onnx, onnxruntime


def storage_metadata(binding: type[ModelBinding]) -> dict[str, object]:
    """What an ONNX file whose inputs take the blocks' storage records in its metadata_props
    (under METADATA_KEY), read back by `exported_metadata`."""
    import soagen
    from soagen.runtime.aot import describe_binding

    return {
        "format": METADATA_FORMAT,
        "soagen_version": soagen.__version__,
        "schema": binding.SCHEMA,
        "binding": describe_binding(binding),
        "storage_inputs": {
            spec.name: [f"soagen.{spec.name}", block_storage(spec).rows] for spec in binding.INPUTS
        },
        "range_inputs": {
            spec.name: list(range_inputs(block_storage(spec))) for spec in binding.INPUTS
        },
    }


# The metadata entry of a `soagen compile` file naming the input whose element count each output
# had at every check against the eager model. A count (as text) is read too, never written.
OUTPUT_COUNTS_KEY = "output_counts"


def recorded_output_counts(
    exported: Mapping[str, object], binding: type[ModelBinding], source: str
) -> dict[str, str]:
    """The output counts a `soagen compile` file records (`OUTPUT_COUNTS_KEY`); ModelLoadError
    where an entry names no output, or neither an input nor a count >= 1."""
    recorded = exported.get(OUTPUT_COUNTS_KEY, {})
    outputs = [spec.name for spec in binding.OUTPUTS]
    inputs = [spec.name for spec in binding.INPUTS]
    what = f"{source}: its {METADATA_KEY!r} metadata's {OUTPUT_COUNTS_KEY!r}"
    if not isinstance(recorded, dict):
        raise ModelLoadError(f"{what} is not a mapping")
    for name, count in recorded.items():
        if name not in outputs:
            raise ModelLoadError(
                f"{what} names {name!r}, no output of {binding.NAME} ({', '.join(outputs)})"
            )
        if not isinstance(count, str) or not (
            count in inputs or (count.isascii() and count.isdigit() and int(count) >= 1)
        ):
            raise ModelLoadError(
                f"{what} gives output {name!r} {count!r}, neither an input of {binding.NAME} "
                f"({', '.join(inputs)}) nor a count >= 1"
            )
    return dict(recorded)


def exported_metadata(
    model: typing.Any, binding: type[ModelBinding], source: str
) -> dict[str, object] | None:
    """The soagen metadata of a file `soagen compile` wrote (its inputs take the blocks'
    storage), None for any other ONNX file; ModelLoadError where it was written for another
    binding or geometry, naming what differs."""
    import json

    text = next((p.value for p in model.metadata_props if p.key == METADATA_KEY), None)
    if text is None:
        return None
    try:
        recorded = json.loads(text)
    except ValueError:
        raise ModelLoadError(f"{source}: its {METADATA_KEY!r} metadata is not JSON") from None
    expected = json.loads(json.dumps(storage_metadata(binding)))  # tuples as JSON lists
    differ = [
        key
        for key in ("format", "binding", "storage_inputs", "range_inputs")
        if recorded.get(key) != expected[key]
    ]
    if differ:
        shown = "; ".join(
            f"{key}: the file {json.dumps(recorded.get(key))}, {binding.NAME} "
            f"{json.dumps(expected[key])}"
            for key in differ
        )
        raise ModelLoadError(
            f"{source} was exported by soagen compile for another binding or block geometry "
            f"than {binding.NAME} of this schema ({shown}): export it again from this schema"
        )
    return typing.cast(dict[str, object], recorded)


# --- the backend -------------------------------------------------------------------------------

# Adapted models by (file digest, schema, model, output mode): bindings of one class over one file
# adapt it once.
_adapted_cache: dict[tuple[str, str, str, str], bytes] = {}
_adapted_lock = threading.Lock()


class OnnxBackend(Backend):
    """An ONNX file run by ONNX Runtime, on each input block's storage in place.

    `providers`: ONNX Runtime's execution providers for CPU collections (default
    `["CPUExecutionProvider"]`); CUDA collections run on `CUDAExecutionProvider` on their GPU and the
    caller's current stream (or `stream=`). `session_options`: attributes of
    `onnxruntime.SessionOptions` to set on each session (`{"intra_op_num_threads": 4}`); soagen's
    defaults are 1 intra-op and 1 inter-op thread, set on the session, never process-wide.
    `outputs`: "staged" (ONNX Runtime writes into scratch tensors, copied once the run succeeded)
    or "in_place" (straight into the output blocks, for models whose outputs are large); see the
    module's doc for what each leaves after a failure.
    """

    kind = "onnxruntime"
    records_autograd = False
    writes_outputs = True
    adapts_inputs = True
    moves_version_counters = False

    def __init__(
        self,
        path: Path,
        binding: type[ModelBinding],
        *,
        providers: Sequence[object] | None = None,
        session_options: Mapping[str, object] | None = None,
        outputs: str = "staged",
    ) -> None:
        onnx, onnxruntime = import_onnx()
        super().__init__(str(path))
        if outputs not in OUTPUT_MODES:
            raise ModelLoadError(
                f"outputs must be one of {', '.join(OUTPUT_MODES)}; got {outputs!r}"
            )
        self.binding = binding
        self.output_mode = outputs
        in_place = outputs == "in_place"
        # Staged outputs are written after the run: an output over an input's memory is harmless.
        self.outputs_may_overlap_inputs = outputs == "staged"
        self.providers = list(providers) if providers is not None else ["CPUExecutionProvider"]
        blank = onnxruntime.SessionOptions()
        unknown = [name for name in (session_options or {}) if not hasattr(blank, name)]
        if unknown:
            raise ModelLoadError(
                f"session_options: onnxruntime.SessionOptions has no {', '.join(map(repr, unknown))}"
            )
        self.session_options = {
            "intra_op_num_threads": 1,
            "inter_op_num_threads": 1,
            **(session_options or {}),
        }
        try:
            model = onnx.load(str(path))  # external data, if any, from beside the file
        except Exception as error:  # protobuf's DecodeError and onnx's own, by version
            raise ModelLoadError(f"{path} is not an ONNX model: {error}") from None
        initializers = {tensor.name for tensor in model.graph.initializer}
        storages = {spec.name: block_storage(spec) for spec in (*binding.INPUTS, *binding.OUTPUTS)}
        # A `soagen compile` file takes the storage already and was checked against the eager
        # model when it was written: there is no original to adapt or to compare with.
        exported = exported_metadata(model, binding, str(path))
        self.storage_inputs = exported is not None
        input_ports: list[_Port] | None = None
        if exported is not None:
            self._output_ports = storage_file_outputs(str(path), binding, model, storages)
            self._output_counts = recorded_output_counts(exported, binding, str(path))
            self._suggested_counts: dict[str, str] = {}
        else:
            input_ports, self._output_ports = match_ports(
                str(path),
                binding,
                _ports(model.graph.input, initializers),
                _ports(model.graph.output),
                storages,
            )
            self._output_counts = {}
            self._suggested_counts = counts_from_symbols(
                binding, input_ports, self._output_ports, storages
            )
        self._input_ports = input_ports or []
        self._input_storages = [storages[spec.name] for spec in binding.INPUTS]
        self._output_storages = [storages[spec.name] for spec in binding.OUTPUTS]
        serialized = model.SerializeToString()
        self._original: bytes | None = None if self.storage_inputs else serialized
        key = (
            hashlib.sha256(serialized).hexdigest(),
            binding.SCHEMA,
            binding.NAME,
            outputs,
        )
        with _adapted_lock:
            adapted = _adapted_cache.get(key)
            if adapted is None:
                if self.storage_inputs and not in_place:
                    adapted = serialized
                else:
                    adapted = adapt(
                        model, binding, input_ports, self._output_ports, storages, outputs
                    ).SerializeToString()
                _adapted_cache[key] = adapted
        self._adapted = adapted
        # (device, which inputs are bound from before their first element) already compared with
        # the original model.
        self._checked: set[tuple[str, tuple[bool, ...]]] = set()

    @property
    def output_counts(self) -> Mapping[str, str]:
        """In a file `soagen compile` wrote, the outputs whose element count was an input
        collection's at each of the export's checks against the eager model
        (`OUTPUT_COUNTS_KEY`)."""
        return dict(self._output_counts)

    @property
    def suggested_output_counts(self) -> Mapping[str, str]:
        """In any other file, the outputs whose element axis it names by the symbol of an
        input's (`counts_from_symbols`)."""
        return dict(self._suggested_counts)

    def place(self, device: torch.device) -> Runner:
        import numpy
        import torch

        onnxruntime = import_onnx()[1]
        on_cuda = device.type == "cuda"
        if device.type not in ("cpu", "cuda"):
            raise BindingError(
                f"{self.description}: ONNX Runtime runs on cpu or cuda, not {device}"
            )
        device_id = device.index or 0
        sessions: dict[int, typing.Any] = {}  # per CUDA stream (0 on the CPU)
        references: dict[int, typing.Any] = {}
        # None on the CPU: ONNX Runtime's Python run looks a CUDA-graph key up in any RunOptions
        # given, and the missing key's exception costs about 60 us per call.
        run_options = None
        if on_cuda:
            run_options = onnxruntime.RunOptions()
            # The run is queued on the caller's stream like torch's own kernels: no host wait.
            run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        from soagen.runtime.buffers import copy_values

        inputs, outputs = self._input_storages, self._output_storages
        count = len(inputs)
        staged = self.output_mode == "staged"
        # What each call binds that does not depend on the call: names and element types.
        input_names = [f"soagen.{storage.binding}" for storage in inputs]
        input_types = [ONNX_ELEMENT_TYPES[storage.dtype] for storage in inputs]
        output_types = [ONNX_ELEMENT_TYPES[storage.dtype] for storage in outputs]
        output_rows = [row_outputs(storage.binding, storage.rows) for storage in outputs]
        range_names = [range_inputs(storage) for storage in inputs]

        def session_for(model: bytes, cache: dict[int, typing.Any], stream: int) -> typing.Any:
            session = cache.get(stream)
            if session is None:
                session = self._session(onnxruntime, model, device, stream)
                cache[stream] = session
            return session

        def plan(
            views: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], stream: int
        ) -> _Plan:
            """Everything bound for one geometry of the call's blocks."""
            session = session_for(self._adapted, sessions, stream)
            binding = session.io_binding()
            ranges = numpy.empty(3 * count, dtype=numpy.int64)
            shifted = []
            for position, (storage, view) in enumerate(zip(inputs, views, strict=True)):
                origin, shape, start, stop, elements = _bound_input(storage, view)
                binding.bind_input(
                    input_names[position],
                    device.type,
                    device_id,
                    input_types[position],
                    shape,
                    origin,
                )
                first = 3 * position
                ranges[first : first + 3] = (start, stop, elements)
                for offset, name in enumerate(range_names[position]):
                    address = ranges.ctypes.data + (first + offset) * ranges.itemsize
                    binding.bind_input(name, "cpu", 0, 7, [1], address)
                shifted.append(bool(start) and not storage.scalar)
            scratch = []
            for storage, port, target, element_type, rows in zip(
                outputs, self._output_ports, targets, output_types, output_rows, strict=True
            ):
                if staged:
                    held = torch.empty(target.shape, dtype=target.dtype, device=target.device)
                    scratch.append(held)
                    binding.bind_output(
                        port.name,
                        device.type,
                        device_id,
                        element_type,
                        list(held.shape),
                        held.data_ptr(),
                    )
                    continue
                pitch, values = _row_geometry(storage, target)
                address, step = target.data_ptr(), pitch * target.element_size()
                for row, name in enumerate(rows):
                    binding.bind_output(
                        name,
                        device.type,
                        device_id,
                        element_type,
                        [1, values],
                        address + row * step,
                    )
            return _Plan(session, binding, ranges, scratch, (str(device), tuple(shifted)))

        plans = threading.local()

        def run(tensors: Sequence[torch.Tensor]) -> object:
            views, targets = tensors[:count], tensors[count:]
            stream = torch.cuda.current_stream(device).cuda_stream if on_cuda else 0
            # A binding holds addresses and shapes only, and rebinding costs ONNX Runtime more
            # than the run of a small model: calls on the same blocks (same addresses, shapes,
            # strides and buffer bounds) run the binding made for them before.
            key = (
                stream,
                *[(t.data_ptr(), t.shape, t.stride()) for t in tensors],
                *[_bounds(view) for view in views],
            )
            cached: dict[tuple[object, ...], _Plan] | None = getattr(plans, "cached", None)
            if cached is None:
                cached = plans.cached = {}
            bound = cached.get(key)
            if bound is None:
                bound = plan(views, targets, stream)
                # Large staged outputs are not held between calls: their scratch is memory, and a
                # model that large does not notice the binding's cost.
                if sum(held.nbytes for held in bound.scratch) <= _PLAN_SCRATCH_BYTES:
                    if len(cached) >= _PLANS_PER_THREAD:
                        del cached[next(iter(cached))]
                    cached[key] = bound
            reference = None
            if self._original is not None and bound.check_key not in self._checked:
                reference = self._reference(
                    session_for(self._original, references, stream), views, targets, device
                )
                before = [target.clone() for target in targets]
            bound.session.run_with_iobinding(bound.binding, run_options)
            for target, held in zip(targets, bound.scratch, strict=False):
                copy_values(target, held)
            if reference is not None:
                self._compare(targets, reference, views, before)
                self._checked.add(bound.check_key)
            return None

        return run

    def _session(
        self, onnxruntime: typing.Any, model: bytes, device: torch.device, stream: int
    ) -> typing.Any:
        options = onnxruntime.SessionOptions()
        for name, value in self.session_options.items():
            setattr(options, name, value)
        providers: list[object] = list(self.providers)
        wanted = "CPUExecutionProvider"
        if device.type == "cuda":
            wanted = "CUDAExecutionProvider"
            if wanted not in onnxruntime.get_available_providers():
                raise BindingError(
                    f"{self.description}: the collections are on {device}, and this onnxruntime "
                    f"has no CUDA execution provider (install onnxruntime-gpu)"
                )
            providers = [
                (
                    wanted,
                    {"device_id": device.index or 0, "user_compute_stream": str(stream)},
                ),
                "CPUExecutionProvider",
            ]
        try:
            session = onnxruntime.InferenceSession(model, options, providers=providers)
        except Exception as error:  # onnxruntime's own exception types vary by version
            raise ModelLoadError(f"ONNX Runtime cannot load {self.description}: {error}") from None
        if wanted not in session.get_providers():
            # ONNX Runtime falls back to the CPU when a provider fails to load: data on a GPU
            # would then be read through host pointers.
            raise ModelLoadError(
                f"ONNX Runtime did not take {wanted} for {self.description} on {device} (it runs "
                f"{', '.join(session.get_providers())})"
            )
        return session

    def _reference(
        self,
        session: typing.Any,
        views: Sequence[torch.Tensor],
        targets: Sequence[torch.Tensor],
        device: torch.device,
    ) -> list[torch.Tensor]:
        """The original model's outputs on contiguous copies of the inputs."""
        import torch

        binding = session.io_binding()
        copies = [view.contiguous() for view in views]
        for port, copy in zip(self._input_ports, copies, strict=True):
            binding.bind_input(
                port.name,
                device.type,
                device.index or 0,
                port.element_type,
                list(copy.shape),
                copy.data_ptr(),
            )
        results = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in targets]
        for port, result in zip(self._output_ports, results, strict=True):
            binding.bind_output(
                port.name,
                device.type,
                device.index or 0,
                port.element_type,
                list(result.shape),
                result.data_ptr(),
            )
        session.run_with_iobinding(binding)
        return results

    def _compare(
        self,
        targets: Sequence[torch.Tensor],
        reference: Sequence[torch.Tensor],
        views: Sequence[torch.Tensor],
        before: Sequence[torch.Tensor],
    ) -> None:
        from soagen.runtime.agreement import first_disagreement

        names = [spec.name for spec in self.binding.OUTPUTS]
        found = first_disagreement(names, targets, reference)
        if found is None:
            return
        for target, held in zip(targets, before, strict=True):
            target.copy_(held)
        counts = ", ".join(
            f"{storage.binding} n={view.shape[storage.element_axis]}"
            for storage, view in zip(self._input_storages, views, strict=True)
            if storage.element_axis is not None
        )
        raise CompiledModelMismatchError(
            f"{self.binding.NAME}: the ONNX graph soagen adapted from {self.description} to read "
            f"the blocks in place disagrees with the original model run by ONNX Runtime on "
            f"contiguous copies, on output {found.output!r} at {counts}: {found.detail}; the "
            f"output blocks were put back as they were. Report it to soagen with the model"
        )


# Bindings kept per thread (oldest dropped first): a loop over a few reused buffers hits them.
_PLANS_PER_THREAD = 8
# The most scratch (staged outputs) a kept binding may hold: at most 8 x 1 MiB per thread.
_PLAN_SCRATCH_BYTES = 1 << 20


class _Plan(typing.NamedTuple):
    """A session's IO binding for one geometry of a call's blocks, what it binds besides them
    (the element ranges, staged outputs' scratch tensors), and which geometry check it needs."""

    session: typing.Any
    binding: typing.Any
    ranges: typing.Any
    scratch: list[torch.Tensor]
    check_key: tuple[str, tuple[bool, ...]]


def _bounds(view: torch.Tensor) -> tuple[int, int]:
    """Where a view's buffer starts and how long it is: where its rows may be bound from."""
    memory = view.untyped_storage()
    return memory.data_ptr(), memory.nbytes()


def _row_geometry(storage: BlockStorage, tensor: torch.Tensor) -> tuple[int, int]:
    """(pitch, values per row) of a block's view: the distance between its rows and the values
    each row holds for the view's elements; BindingError where the strides are not the block's."""
    shape, strides = tensor.shape, tensor.stride()
    n = 1 if storage.element_axis is None else shape[storage.element_axis]
    values = 1 if storage.scalar else n * storage.per_element
    spread = [axis for axis in storage.row_axes if shape[axis] > 1]
    pitch = strides[spread[-1]] if spread else values
    problem = None
    if (
        storage.element_axis is not None
        and n > 1
        and strides[storage.element_axis] != storage.per_element
    ):
        problem = f"its elements are {strides[storage.element_axis]} values apart"
    elif _gaps(shape, strides, spread) or _gaps(shape, strides, storage.inner_axes, innermost=1):
        problem = "its rows do not lie at one pitch"
    elif spread and pitch < values:
        problem = f"its rows are {pitch} values apart and hold {values}"
    if problem:
        raise BindingError(
            f"{storage.binding}: a view of shape {list(shape)} and strides {list(strides)} is not "
            f"the block's storage ({problem}); ONNX models take the collections' own blocks"
        )
    return pitch, values


def _bound_input(storage: BlockStorage, view: torch.Tensor) -> tuple[int, list[int], int, int, int]:
    """(address, [rows, pitch], start, stop, element count) to bind an input block's storage.

    The rows are bound from the view's first value where all of them fit in its memory. A slice
    near the end of its buffer would overrun it (its last row's pitch runs past its elements), so
    its rows are then bound from as far before its first value as they overrun, and the graph
    starts each row there: the bytes before it are earlier elements of the same columns (or of the
    members before them), always within the buffer.
    """
    pitch, values = _row_geometry(storage, view)
    itemsize = view.element_size()
    first, size = _bounds(view)
    end = first + size
    origin = view.data_ptr()
    overrun = origin + storage.rows * pitch * itemsize - end
    shift = -(-overrun // itemsize) if overrun > 0 else 0
    n = 1 if storage.element_axis is None else view.shape[storage.element_axis]
    return origin - shift * itemsize, [storage.rows, pitch], shift, shift + values, n
