"""ONNX models run by ONNX Runtime on SoA blocks where they lie: IO binding, no host copies.

A user's ONNX model takes contiguous tensors in each binding's declared axis order (`[n, c]`,
`[n, 17, 32]`, ...). SoA blocks are rows of values at a pitch instead: a block of C columns (of k
coefficient columns each, for array columns) is R = C * k rows of `pitch` values, padding included,
the element axis running along each row. At load the graph is adapted once per binding (the file is
left as it is; the adapted model is cached per file and binding):

- each input takes the block's storage as it lies in the buffer, a dense `[R, pitch]` tensor bound
  at the buffer's own address; the graph slices each row to the call's elements (their first and
  last value in the row come in one small int64 input, `soagen.ranges`, three values per input:
  start, stop, element count), reshapes the rows to the block's storage dimensions and transposes
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
from dataclasses import dataclass
from pathlib import Path

from soagen.runtime.backends import Backend, Runner
from soagen.runtime.errors import BindingError, CompiledModelMismatchError, ModelLoadError
from soagen.runtime.spec import BindingSpec

if typing.TYPE_CHECKING:
    import torch

    from soagen.runtime.model import ModelBinding

# The extra that installs what this module needs.
EXTRA = "onnx"

# ONNX's element type (TensorProto.DataType) of each soagen dtype.
ONNX_ELEMENT_TYPES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
    "bfloat16": 16,
}
_DTYPE_OF_ELEMENT_TYPE = {value: key for key, value in ONNX_ELEMENT_TYPES.items()}

# Where outputs are written: the graph's rows bound in the output blocks, or scratch tensors copied.
OUTPUT_MODES = ("in_place", "staged")

# The element count at which a block's geometry is read to tell its axes apart: pitches are then at
# least this many values, far above any per-element extent, and off every alignment multiple.
_REFERENCE_N = 1_000_003

# The adapted graph's input holding each input's (start, stop, element count).
RANGES_INPUT = "soagen.ranges"

# The metadata_props key of an ONNX file `soagen compile` wrote, whose inputs already take the
# blocks' storage: JSON naming its format, the binding it was exported for and its storage rows.
METADATA_KEY = "soagen"
METADATA_FORMAT = "soagen-onnx-storage-1"


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


@dataclass(frozen=True, slots=True)
class BlockStorage:
    """How one block lies in its buffer, as rows of values at one pitch.

    `order` lists the declared axes (their positions) in storage order: the row axes, outermost
    first, then the element axis, then a packed column's axes inside one element. `per_element` is
    the element axis's stride in values: 1 for columns, k for packed columns, 0 for scalars.
    """

    binding: str
    dtype: str
    axes: tuple[str, ...]
    sizes: tuple[int, ...]  # declared extents, 0 for the element axis
    element_axis: int | None
    order: tuple[int, ...]
    row_axes: tuple[int, ...]
    inner_axes: tuple[int, ...]
    per_element: int

    @property
    def rows(self) -> int:
        count = 1
        for axis in self.row_axes:
            count *= self.sizes[axis]
        return count

    @property
    def scalar(self) -> bool:
        return self.per_element == 0

    def declared(self) -> str:
        return f"[{', '.join(self._dims())}]"

    def _dims(self) -> list[str]:
        return [
            "n" if axis == "n" else str(size)
            for axis, size in zip(self.axes, self.sizes, strict=False)
        ]


def block_storage(spec: BindingSpec) -> BlockStorage:
    """The storage of a binding's block, from its closed-form geometry; ModelLoadError where its
    rows do not lie at one pitch (which no adaptation can bind as one dense tensor)."""
    block = spec.block
    view = block.view(_REFERENCE_N)
    element_axis = block.element_axis
    per_element = 1 if element_axis is None else view.strides[element_axis]
    sizes = tuple(
        0 if axis == "n" else size for axis, size in zip(block.axes, view.shape, strict=False)
    )
    others = [axis for axis in range(len(block.axes)) if axis != element_axis]
    # A packed column's values of one element lie within `per_element` values; rows lie a pitch
    # (at least _REFERENCE_N values) apart. Size-1 axes may go anywhere: they move no value.
    inner = [a for a in others if per_element > 1 and view.strides[a] < per_element]
    rows = [a for a in others if a not in inner]

    def outermost_first(axes: list[int]) -> tuple[int, ...]:
        return tuple(sorted(axes, key=lambda a: -view.strides[a]))

    row_axes, inner_axes = outermost_first(rows), outermost_first(inner)
    problem = _gaps(view.shape, view.strides, row_axes) or _gaps(
        view.shape, view.strides, inner_axes, innermost=1
    )
    if per_element > 1 and _product(view.shape, inner_axes) != per_element:
        problem = "a packed column's values do not fill each element"
    if problem:
        raise ModelLoadError(
            f"input or output {spec.name!r} ({block.layout}{{{', '.join(block.members)}}}) cannot "
            f"be bound as one dense tensor of rows: {problem}"
        )
    order = (*row_axes, *(() if element_axis is None else (element_axis,)), *inner_axes)
    return BlockStorage(
        spec.name,
        block.dtype,
        block.axes,
        sizes,
        element_axis,
        order,
        row_axes,
        inner_axes,
        per_element,
    )


def _product(shape: Sequence[int], axes: Sequence[int]) -> int:
    result = 1
    for axis in axes:
        result *= shape[axis]
    return result


def _gaps(
    shape: Sequence[int], strides: Sequence[int], axes: Sequence[int], innermost: int | None = None
) -> str | None:
    """Why the axes (outermost first) are not one dense arrangement of their innermost stride (or
    of `innermost`), if they are not."""
    spread = [axis for axis in axes if shape[axis] > 1]
    for outer, inner in zip(spread, spread[1:], strict=False):
        if strides[outer] != strides[inner] * shape[inner]:
            return f"axis {outer} is {strides[outer]} values apart, not {strides[inner] * shape[inner]}"
    if innermost is not None and spread and strides[spread[-1]] != innermost:
        return f"axis {spread[-1]} is {strides[spread[-1]]} values apart, not {innermost}"
    return None


# --- validation --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Port:
    """One input or output of the ONNX graph: name, dtype (None: one soagen has no name for),
    dims (an int, a symbol's name, or None where unknown; None for an unknown rank)."""

    name: str
    dtype: str | None
    element_type: int
    dims: tuple[int | str | None, ...] | None

    def described(self) -> str:
        dtype = self.dtype or f"element type {self.element_type}"
        if self.dims is None:
            return f"{self.name} {dtype} (shape unknown)"
        dims = ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name} {dtype} [{dims}]"


def _ports(values: Sequence[typing.Any], exclude: set[str] = frozenset()) -> list[_Port]:  # type: ignore[assignment]
    ports = []
    for value in values:
        if value.name in exclude:
            continue
        tensor = value.type.tensor_type
        dims: tuple[int | str | None, ...] | None = None
        if tensor.HasField("shape"):
            dims = tuple(
                d.dim_value
                if d.HasField("dim_value")
                else (d.dim_param if d.HasField("dim_param") else None)
                for d in tensor.shape.dim
            )
        element_type = int(tensor.elem_type)
        ports.append(
            _Port(value.name, _DTYPE_OF_ELEMENT_TYPE.get(element_type), element_type, dims)
        )
    return ports


def _described_spec(spec: BindingSpec, storage: BlockStorage) -> str:
    block = spec.block
    return (
        f"{spec.name} {block.dtype} {storage.declared()} "
        f"({block.layout}{{{', '.join(block.members)}}})"
    )


def match_ports(
    source: str,
    binding: type[ModelBinding],
    inputs: Sequence[_Port],
    outputs: Sequence[_Port],
    storages: Mapping[str, BlockStorage],
) -> tuple[list[_Port], list[_Port]]:
    """The ONNX inputs and outputs in schema order: matched by name where the names are the
    schema's, else by position; ModelLoadError, listing both sides, where they do not fit."""
    matched: list[list[_Port]] = []
    problems: list[str] = []
    for role, specs, ports in (
        ("input", binding.INPUTS, inputs),
        ("output", binding.OUTPUTS, outputs),
    ):
        names = [spec.name for spec in specs]
        by_name = {port.name: port for port in ports}
        if sorted(by_name) == sorted(names):
            ordered = [by_name[name] for name in names]
        elif len(ports) == len(specs):
            ordered = list(ports)
        else:
            problems.append(f"it has {len(ports)} {role}(s), the schema {len(specs)}")
            matched.append([])
            continue
        for spec, port in zip(specs, ordered, strict=True):
            problem = _misfit(spec, port, storages[spec.name])
            if problem:
                problems.append(f"{role} {port.name!r} (bound to {spec.name!r}) {problem}")
        matched.append(ordered)
    if problems:
        sides = "\n".join(
            [
                "  the ONNX model: inputs "
                + ", ".join(p.described() for p in inputs)
                + "; outputs "
                + ", ".join(p.described() for p in outputs),
                "  the schema: inputs "
                + ", ".join(_described_spec(s, storages[s.name]) for s in binding.INPUTS)
                + "; outputs "
                + ", ".join(_described_spec(s, storages[s.name]) for s in binding.OUTPUTS),
            ]
        )
        raise ModelLoadError(
            f"{source} does not fit {binding.NAME}: {'; '.join(problems)}\n{sides}"
        )
    return matched[0], matched[1]


def _misfit(spec: BindingSpec, port: _Port, storage: BlockStorage) -> str | None:
    if port.dtype != spec.block.dtype:
        return f"holds {port.dtype or f'element type {port.element_type}'}, the block {spec.block.dtype}"
    if port.dims is None:
        return None  # checked by ONNX Runtime at run time, and by the first call's comparison
    if len(port.dims) != len(storage.axes):
        return f"has {len(port.dims)} dimensions, the block's axes are {storage.declared()}"
    for position, (axis, size, dim) in enumerate(
        zip(storage.axes, storage.sizes, port.dims, strict=False)
    ):
        if axis == "n" and isinstance(dim, int):
            return (
                f"has a fixed batch size {dim} in dimension {position}, the block's element axis: "
                f"soagen runs every element count, so the model needs a dynamic dimension there "
                f"(export it with a dynamic batch: dynamic_shapes= or dynamic_axes=)"
            )
        if axis != "n" and isinstance(dim, int) and dim != size:
            return f"has {dim} in dimension {position}, the block {size} ({storage.declared()})"
    return None


# --- adaptation --------------------------------------------------------------------------------


def adapt(
    model: typing.Any,
    binding: type[ModelBinding],
    inputs: Sequence[_Port] | None,
    outputs: Sequence[_Port],
    storages: Mapping[str, BlockStorage],
    mode: str,
) -> typing.Any:
    """A copy of the ONNX model whose inputs take the blocks' storage (see the module's doc) and
    whose outputs are each output block's rows (mode "in_place") or the model's own ("staged").
    `inputs` None: the model's inputs take the storage already (a `soagen compile` file)."""
    import onnx
    from onnx import helper

    adapted = onnx.ModelProto()
    adapted.CopyFrom(model)
    graph = adapted.graph
    opset = next(
        (o.version for o in adapted.opset_import if o.domain in ("", "ai.onnx")),
        0,
    )
    if opset < 13:
        raise ModelLoadError(
            f"the ONNX model imports opset {opset}; soagen adapts models of opset 13 or later "
            f"(re-export it, or convert it with onnx.version_converter)"
        )
    nodes: list[typing.Any] = []  # the inputs' adaptation, before the model's nodes
    output_nodes: list[typing.Any] = []  # the outputs', after them
    constants: list[typing.Any] = []

    def constant(name: str, values: Sequence[int]) -> str:
        full = f"soagen.{name}"
        constants.append(helper.make_tensor(full, onnx.TensorProto.INT64, [len(values)], values))
        return full

    if inputs is not None:
        nodes = adapted_inputs(graph, binding, inputs, storages, constant)
    if mode == "in_place":
        del graph.output[:]
        for position, (spec, port) in enumerate(zip(binding.OUTPUTS, outputs, strict=True)):
            storage = storages[spec.name]
            prefix = f"{spec.name}.out{position}"
            perm = list(storage.order)
            source = port.name
            if perm != sorted(perm):
                source = f"soagen.{prefix}.storage_order"
                output_nodes.append(helper.make_node("Transpose", [port.name], [source], perm=perm))
            rows = row_outputs(spec.name, storage.rows)
            flat = rows[0] if len(rows) == 1 else f"soagen.{prefix}.rows"
            output_nodes.append(
                helper.make_node(
                    "Reshape", [source, constant(f"{prefix}.flat", [storage.rows, -1])], [flat]
                )
            )
            if len(rows) > 1:
                output_nodes.append(
                    helper.make_node(
                        "Split",
                        [flat, constant(f"{prefix}.split", [1] * len(rows))],
                        rows,
                        axis=0,
                    )
                )
            element_type = ONNX_ELEMENT_TYPES[storage.dtype]
            for row in rows:
                graph.output.append(
                    helper.make_tensor_value_info(row, element_type, [1, f"{spec.name}_values"])
                )
    graph.initializer.extend(constants)
    # The adaptation's nodes first: graphs are topologically sorted, and they feed the model's.
    original = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *original, *output_nodes])
    return adapted


def adapted_inputs(
    graph: typing.Any,
    binding: type[ModelBinding],
    inputs: Sequence[_Port],
    storages: Mapping[str, BlockStorage],
    constant: typing.Callable[[str, Sequence[int]], str],
) -> list[typing.Any]:
    """Replace the graph's inputs with the blocks' storage and the ranges input: the nodes that
    slice and reorder them into the model's inputs (see the module's doc)."""
    import onnx
    from onnx import helper

    nodes: list[typing.Any] = []
    original_inputs = {port.name for port in inputs}
    kept = [value for value in graph.input if value.name not in original_inputs]
    del graph.input[:]
    graph.input.extend(kept)
    graph.input.append(
        helper.make_tensor_value_info(RANGES_INPUT, onnx.TensorProto.INT64, [3 * len(inputs)])
    )
    for position, (spec, port) in enumerate(zip(binding.INPUTS, inputs, strict=True)):
        storage = storages[spec.name]
        prefix = f"{spec.name}.{position}"
        stored = f"soagen.{spec.name}"
        graph.input.append(
            helper.make_tensor_value_info(
                stored, ONNX_ELEMENT_TYPES[storage.dtype], [storage.rows, f"{spec.name}_pitch"]
            )
        )
        bounds = []
        for offset, what in enumerate(("start", "stop", "count")):
            name = f"soagen.{prefix}.{what}"
            first = 3 * position + offset
            nodes.append(
                helper.make_node(
                    "Slice",
                    [
                        RANGES_INPUT,
                        constant(f"{name}.from", [first]),
                        constant(f"{name}.to", [first + 1]),
                    ],
                    [name],
                )
            )
            bounds.append(name)
        sliced = f"soagen.{prefix}.sliced"
        nodes.append(
            helper.make_node(
                "Slice", [stored, bounds[0], bounds[1], constant(f"{prefix}.axis", [1])], [sliced]
            )
        )
        if storage.scalar and storage.element_axis is not None:
            # One value per collection: the model sees it repeated for every element.
            shape = f"soagen.{prefix}.expanded_shape"
            nodes.append(
                helper.make_node(
                    "Concat",
                    [constant(f"{prefix}.rows", [storage.rows]), bounds[2]],
                    [shape],
                    axis=0,
                )
            )
            expanded = f"soagen.{prefix}.expanded"
            nodes.append(helper.make_node("Expand", [sliced, shape], [expanded]))
            sliced = expanded
        for step, (dims, perm) in enumerate(axis_moves(storage)):
            grouped, moved = f"soagen.{prefix}.grouped{step}", f"soagen.{prefix}.moved{step}"
            nodes.append(
                helper.make_node(
                    "Reshape", [sliced, constant(f"{prefix}.groups{step}", dims)], [grouped]
                )
            )
            nodes.append(helper.make_node("Transpose", [grouped], [moved], perm=perm))
            sliced = moved
        declared = [
            -1 if axis == storage.element_axis else storage.sizes[axis]
            for axis in range(len(storage.axes))
        ]
        nodes.append(
            helper.make_node("Reshape", [sliced, constant(f"{prefix}.dims", declared)], [port.name])
        )
    return nodes


def axis_moves(storage: BlockStorage) -> list[tuple[list[int], list[int]]]:
    """Transposes taking an input's values from storage order to the declared order, as
    (Reshape dims, Transpose perm) pairs: each moves one declared axis outwards to its place,
    its neighbours merged into groups, so that every Transpose is one of `[A, B] -> [B, A]`,
    `[A, B, C] -> [B, A, C]`, `[A, B, C] -> [A, C, B]` or `[A, B, C, D] -> [A, C, B, D]`.

    ONNX Runtime transposes such single-axis moves with MLAS's blocked 2-D transposes or row
    copies; a general permutation (`[32, 17, n] -> [n, 17, 32]` for a column of 17x32 Eigen
    matrices) goes element by element, about ten times slower per value. The element axis is
    always moved first, so the later moves shuffle values within one element.
    """
    current = list(storage.order)

    def extent(axes: Sequence[int]) -> int:
        if storage.element_axis in axes:
            return -1  # the element count: inferred by Reshape, all other extents static
        return _product(storage.sizes, axes)

    moves = []
    for place in range(len(current)):
        at = current.index(place)
        if at == place:
            continue
        groups = [current[:place], current[place:at], [place], current[at + 1 :]]
        current.insert(place, current.pop(at))
        kept = [g for g in groups if g and extent(g) != 1]
        if groups[1] not in kept or groups[2] not in kept:
            continue  # one of the swapped groups holds a single value: no value moves
        perm = list(range(len(kept)))
        first = kept.index(groups[1])
        perm[first], perm[first + 1] = first + 1, first
        moves.append(([extent(g) for g in kept], perm))
    return moves


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
        "ranges_input": RANGES_INPUT,
        "storage_inputs": {
            spec.name: [f"soagen.{spec.name}", block_storage(spec).rows] for spec in binding.INPUTS
        },
    }


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
        for key in ("format", "binding", "ranges_input", "storage_inputs")
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


def storage_file_outputs(
    source: str,
    binding: type[ModelBinding],
    model: typing.Any,
    storages: Mapping[str, BlockStorage],
) -> list[_Port]:
    """The outputs of a file whose inputs take the storage, in schema order, checked as
    `match_ports` checks any model's (its metadata vouched for the inputs)."""
    ports = _ports(model.graph.output)
    by_name = {port.name: port for port in ports}
    problems = []
    for spec in binding.OUTPUTS:
        port = by_name.get(spec.name)
        problem = "is missing" if port is None else _misfit(spec, port, storages[spec.name])
        if problem:
            problems.append(f"output {spec.name!r} {problem}")
    if problems:
        raise ModelLoadError(
            f"{source} does not fit {binding.NAME}: {'; '.join(problems)} (the model's outputs: "
            f"{', '.join(p.described() for p in ports)})"
        )
    return [by_name[spec.name] for spec in binding.OUTPUTS]


def row_outputs(binding: str, rows: int) -> list[str]:
    """The adapted graph's outputs of one output block, one per row in storage order."""
    return [f"soagen.{binding}.row{row}" for row in range(rows)]


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
        self.storage_inputs = exported_metadata(model, binding, str(path)) is not None
        input_ports: list[_Port] | None = None
        if self.storage_inputs:
            self._output_ports = storage_file_outputs(str(path), binding, model, storages)
        else:
            input_ports, self._output_ports = match_ports(
                str(path),
                binding,
                _ports(model.graph.input, initializers),
                _ports(model.graph.output),
                storages,
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
        run_options = onnxruntime.RunOptions()
        if on_cuda:
            # The run is queued on the caller's stream like torch's own kernels: no host wait.
            run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        inputs, outputs = self._input_storages, self._output_storages
        count = len(inputs)
        staged = self.output_mode == "staged"

        def session_for(model: bytes, cache: dict[int, typing.Any]) -> typing.Any:
            stream = torch.cuda.current_stream(device).cuda_stream if on_cuda else 0
            session = cache.get(stream)
            if session is None:
                session = self._session(onnxruntime, model, device, stream)
                cache[stream] = session
            return session

        def run(tensors: Sequence[torch.Tensor]) -> object:
            views, targets = tensors[:count], tensors[count:]
            session = session_for(self._adapted, sessions)
            binding = session.io_binding()
            ranges = numpy.empty(3 * count, dtype=numpy.int64)
            shifted = []
            for position, (storage, view) in enumerate(zip(inputs, views, strict=True)):
                origin, shape, start, stop, elements = _bound_input(storage, view)
                binding.bind_input(
                    f"soagen.{storage.binding}",
                    device.type,
                    device_id,
                    ONNX_ELEMENT_TYPES[storage.dtype],
                    shape,
                    origin,
                )
                ranges[3 * position : 3 * position + 3] = (start, stop, elements)
                shifted.append(bool(start) and not storage.scalar)
            binding.bind_input(RANGES_INPUT, "cpu", 0, 7, [3 * count], ranges.ctypes.data)
            scratch = []
            for storage, port, target in zip(outputs, self._output_ports, targets, strict=True):
                element_type = ONNX_ELEMENT_TYPES[storage.dtype]
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
                for row, name in enumerate(row_outputs(storage.binding, storage.rows)):
                    binding.bind_output(
                        name,
                        device.type,
                        device_id,
                        element_type,
                        [1, values],
                        address + row * step,
                    )
            key = (str(device), tuple(shifted))
            reference = None
            if self._original is not None and key not in self._checked:
                reference = self._reference(
                    session_for(self._original, references), views, targets, device
                )
                before = [target.clone() for target in targets]
            session.run_with_iobinding(binding, run_options)
            from soagen.runtime.buffers import copy_values

            for target, held in zip(targets, scratch, strict=False):
                copy_values(target, held)
            if reference is not None:
                self._compare(targets, reference, views, before)
                self._checked.add(key)
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
    memory = view.untyped_storage()
    end = memory.data_ptr() + memory.nbytes()
    origin = view.data_ptr()
    overrun = origin + storage.rows * pitch * itemsize - end
    shift = -(-overrun // itemsize) if overrun > 0 else 0
    n = 1 if storage.element_axis is None else view.shape[storage.element_axis]
    return origin - shift * itemsize, [storage.rows, pitch], shift, shift + values, n
