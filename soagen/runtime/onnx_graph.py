"""The ONNX graph side of soagen's ONNX models, without torch: each block's storage, the check of
an ONNX model's inputs and outputs against a binding, and the adapted graph whose inputs take the
blocks' storage (`soagen.runtime.onnx`'s module doc describes it).

`soagen.runtime.onnx` runs the adapted graph with ONNX Runtime on collections;
`soagen.serving.onnx_entry` builds a Triton onnxruntime entry from the same adapted graph. Building
a graph needs the `onnx` package (imported where a graph is built), never torch.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from soagen.runtime.errors import ModelLoadError
from soagen.runtime.spec import BindingSpec, following_input

if typing.TYPE_CHECKING:
    from soagen.runtime.model import ModelBinding

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

# The element count at which a block's geometry is read to tell its axes apart: pitches are then at
# least this many values, far above any per-element extent, and off every alignment multiple.
_REFERENCE_N = 1_000_003


# The metadata_props key of an ONNX file `soagen compile` wrote, whose inputs already take the
# blocks' storage: JSON naming its format, the binding it was exported for and its storage rows.
METADATA_KEY = "soagen"
METADATA_FORMAT = "soagen-onnx-storage-2"


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


def _element_dim(port: _Port, storage: BlockStorage) -> int | str | None:
    """The port's dimension on the block's element axis (declared order), None where unknown."""
    if port.dims is None or storage.element_axis is None or len(port.dims) != len(storage.axes):
        return None
    return port.dims[storage.element_axis]


def counts_from_symbols(
    binding: type[ModelBinding],
    inputs: Sequence[_Port],
    outputs: Sequence[_Port],
    storages: Mapping[str, BlockStorage],
) -> dict[str, str]:
    """Outputs whose element axis the file names by the symbol of inputs' element axes (an
    exporter's dynamic axes), each with such an input (`following_input`); `inputs` and `outputs`
    as `match_ports` orders them. Names are an exporter's word, which ONNX Runtime does not hold a
    model to (one name for every dynamic axis is common): a guess for where nothing else says
    (`Backend.suggested_output_counts`). A symbol that inputs of two layouts share, neither the
    output's own, says nothing about which one it follows."""
    named: dict[str, list[BindingSpec]] = {}
    for spec, port in zip(binding.INPUTS, inputs, strict=True):
        dim = _element_dim(port, storages[spec.name])
        if isinstance(dim, str) and dim:
            named.setdefault(dim, []).append(spec)
    counts: dict[str, str] = {}
    for spec, port in zip(binding.OUTPUTS, outputs, strict=True):
        dim = _element_dim(port, storages[spec.name])
        specs = named.get(dim, []) if isinstance(dim, str) else []
        if not specs:
            continue
        chosen = following_input(specs, spec)
        if chosen.block.layout == spec.block.layout or len({s.block.layout for s in specs}) == 1:
            counts[spec.name] = chosen.name
    return counts


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
            extents = [-1 if axis == storage.element_axis else storage.sizes[axis] for axis in perm]
            if extents == [storage.rows, -1] and source != port.name:
                output_nodes[-1].output[0] = flat  # the transpose gives the rows already
            else:
                output_nodes.append(
                    helper.make_node(
                        "Reshape",
                        [source, constant(f"{prefix}.flat", [storage.rows, -1])],
                        [flat],
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
    """Replace the graph's inputs with the blocks' storage and their range inputs: the nodes that
    slice and reorder them into the model's inputs (see the module's doc)."""
    import onnx
    from onnx import helper

    nodes: list[typing.Any] = []
    original_inputs = {port.name for port in inputs}
    kept = [value for value in graph.input if value.name not in original_inputs]
    del graph.input[:]
    graph.input.extend(kept)
    for position, (spec, port) in enumerate(zip(binding.INPUTS, inputs, strict=True)):
        storage = storages[spec.name]
        prefix = f"{spec.name}.{position}"
        stored = f"soagen.{spec.name}"
        graph.input.append(
            helper.make_tensor_value_info(
                stored, ONNX_ELEMENT_TYPES[storage.dtype], [storage.rows, f"{spec.name}_pitch"]
            )
        )
        ranges = range_inputs(storage)
        graph.input.extend(
            helper.make_tensor_value_info(name, onnx.TensorProto.INT64, [1]) for name in ranges
        )
        sliced = f"soagen.{prefix}.sliced"
        nodes.append(
            helper.make_node(
                "Slice", [stored, ranges[0], ranges[1], constant(f"{prefix}.axis", [1])], [sliced]
            )
        )
        # The values' shape as far as the graph knows it, -1 for the one extent n sets: a Reshape
        # to the shape they already have is left out (each node costs ONNX Runtime microseconds).
        current = [storage.rows, -1]
        if len(ranges) == 3:
            # One value per collection: the model sees it repeated for every element.
            shape = f"soagen.{prefix}.expanded_shape"
            nodes.append(
                helper.make_node(
                    "Concat",
                    [constant(f"{prefix}.rows", [storage.rows]), ranges[2]],
                    [shape],
                    axis=0,
                )
            )
            expanded = f"soagen.{prefix}.expanded"
            nodes.append(helper.make_node("Expand", [sliced, shape], [expanded]))
            sliced = expanded
        for step, (dims, perm) in enumerate(axis_moves(storage)):
            if dims != current:
                grouped = f"soagen.{prefix}.grouped{step}"
                nodes.append(
                    helper.make_node(
                        "Reshape", [sliced, constant(f"{prefix}.groups{step}", dims)], [grouped]
                    )
                )
                sliced = grouped
            moved = f"soagen.{prefix}.moved{step}"
            nodes.append(helper.make_node("Transpose", [sliced], [moved], perm=perm))
            sliced, current = moved, [dims[axis] for axis in perm]
        declared = [
            -1 if axis == storage.element_axis else storage.sizes[axis]
            for axis in range(len(storage.axes))
        ]
        if declared == current:
            nodes[-1].output[0] = port.name  # `sliced` is the last node's output
        else:
            nodes.append(
                helper.make_node(
                    "Reshape", [sliced, constant(f"{prefix}.dims", declared)], [port.name]
                )
            )
    return nodes


def range_inputs(storage: BlockStorage) -> tuple[str, ...]:
    """The adapted graph's [1] int64 inputs of one input block: where each row's values for the
    call's elements start and stop, and, for a block of scalars, the element count it is
    repeated to."""
    names: tuple[str, ...] = (f"soagen.{storage.binding}.start", f"soagen.{storage.binding}.stop")
    if storage.scalar and storage.element_axis is not None:
        names += (f"soagen.{storage.binding}.count",)
    return names


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
