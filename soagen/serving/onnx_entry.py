"""The model.onnx of a Triton onnxruntime entry (`soagen triton --backend onnxruntime`): the user's
ONNX model adapted so that its inputs are what the wire carries and its outputs what the client
reads back, so that a client talks to it as to the Python-backend entry.

The wire (`soagen.serving.wire`): each block in storage order after Triton's batch axis of 1
(`node_features` as `[1, 4, n]`), a block of scalars once per event (`[1, rows, 1]`). The entry's
graph is the runtime's adapted graph (`soagen.runtime.onnx_graph.adapt`, outputs "staged": the
model's own) between two thin layers:

- in front, each wire tensor becomes the storage rows that graph takes, `[R, values]`: a reshape
  (the batch axis of 1 folds in), after a transpose only for packed array columns, whose wire order
  puts the element axis after the values of one element; and each input's range inputs, from the
  shapes: start 0, stop the values in a row, and for a block of scalars n, from an input of its
  layout.
- behind it, each output is transposed from declared to wire order and given the inputs' batch
  axis.

The adapted graph's names are prefixed (`onnx.compose.add_prefix`, subgraphs included), so that
none of them meets a wire tensor's name (the bindings' names, which the user's model may use for
its own inputs). Built with the `onnx` package alone: no torch, no ONNX Runtime.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence

from soagen.runtime.onnx_graph import (
    ONNX_ELEMENT_TYPES,
    BlockStorage,
    _ports,
    adapt,
    block_storage,
    match_ports,
    range_inputs,
)
from soagen.serving.wire import WireTensor, wire_tensor

if typing.TYPE_CHECKING:
    from soagen.runtime.model import ModelBinding

# What the adapted graph's names start with in the entry, and what the layers' own names start
# with: wire tensors are named after bindings (identifiers, no dots), so neither meets them.
MODEL_PREFIX = "soagen.model."
_LAYER_PREFIX = "soagen.wire."
# The batch axis's symbol: Triton's onnxruntime backend wants it dynamic where max_batch_size > 0.
BATCH_DIM = "batch"


def entry_wire_tensors(
    binding: type[ModelBinding],
) -> tuple[tuple[WireTensor, ...], tuple[WireTensor, ...]]:
    """Each input's and output's wire tensor as the entry declares it: a block of scalars (an
    input) once per event, as the Python-backend entry takes it."""
    inputs = tuple(
        wire.one_value() if wire.scalars and "n" in wire.axes else wire
        for wire in (wire_tensor(spec) for spec in binding.INPUTS)
    )
    return inputs, tuple(wire_tensor(spec) for spec in binding.OUTPUTS)


def schema_ports(
    model: typing.Any, binding: type[ModelBinding], source: str
) -> tuple[list[typing.Any], list[typing.Any], dict[str, BlockStorage]]:
    """The ONNX model's inputs and outputs in schema order (`match_ports`, as `Model.load` pairs
    them) and each binding's storage; ModelLoadError, listing both sides, where they do not fit."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    storages = {spec.name: block_storage(spec) for spec in (*binding.INPUTS, *binding.OUTPUTS)}
    inputs, outputs = match_ports(
        source,
        binding,
        _ports(model.graph.input, initializers),
        _ports(model.graph.output),
        storages,
    )
    return inputs, outputs, storages


def entry_model(
    model: typing.Any, binding: type[ModelBinding], names: Mapping[str, str], source: str
) -> typing.Any:
    """The entry's ModelProto from the user's `model`; `names`: binding name -> Triton tensor name.
    ModelLoadError (listing both sides) where the model's inputs and outputs do not fit the
    binding's, as `Model.load` refuses it."""
    import onnx
    from onnx import compose, helper

    input_ports, output_ports, storages = schema_ports(model, binding, source)
    adapted = adapt(model, binding, input_ports, output_ports, storages, "staged")
    entry = compose.add_prefix(adapted, MODEL_PREFIX)
    graph = entry.graph
    wires_in, wires_out = entry_wire_tensors(binding)
    nodes: list[typing.Any] = []
    constants: list[typing.Any] = []

    def constant(name: str, values: Sequence[int]) -> str:
        full = f"{_LAYER_PREFIX}{name}"
        constants.append(helper.make_tensor(full, onnx.TensorProto.INT64, [len(values)], values))
        return full

    def dim_of(tensor: str, axis: int, name: str, size: str | None = None) -> str:
        """A [1] int64 tensor (named `size`, if given) holding `tensor`'s size along `axis`
        (Shape's start/end need opset 15; the adaptation takes 13)."""
        shape = f"{_LAYER_PREFIX}{name}.shape"
        nodes.append(helper.make_node("Shape", [tensor], [shape]))
        size = size or f"{_LAYER_PREFIX}{name}.size"
        nodes.append(
            helper.make_node(
                "Slice",
                [shape, constant(f"{name}.from", [axis]), constant(f"{name}.to", [axis + 1])],
                [size],
            )
        )
        return size

    ranges = {
        spec.name: [f"{MODEL_PREFIX}{name}" for name in range_inputs(storages[spec.name])]
        for spec in binding.INPUTS
    }
    stored_names = {f"{MODEL_PREFIX}soagen.{spec.name}" for spec in binding.INPUTS}
    stored_names.update(name for names in ranges.values() for name in names)
    kept = [value for value in graph.input if value.name not in stored_names]
    del graph.input[:]
    counts: dict[str, str] = {}  # layout -> its element count, from its first input with columns
    for spec, wire in zip(binding.INPUTS, wires_in, strict=True):
        if not wire.is_one_value and wire.element_axis is not None:
            counts.setdefault(
                spec.block.layout, dim_of(names[spec.name], 1 + wire.element_axis, f"{spec.name}.n")
            )
    for spec, wire in zip(binding.INPUTS, wires_in, strict=True):
        storage = storages[spec.name]
        tensor = names[spec.name]
        graph.input.append(_wire_value(tensor, wire))
        rows = _storage_rows(tensor, wire, storage, nodes, constant, spec.name)
        # The wire carries the call's values alone: each row is taken whole.
        start, stop, *count = ranges[spec.name]
        constants.append(helper.make_tensor(start, onnx.TensorProto.INT64, [1], [0]))
        dim_of(rows, 1, f"{spec.name}.values", stop)
        if count:
            # A block of scalars travels once per event: its layout's n comes from another input
            # (`soagen triton` refuses a layout bound only as scalars).
            nodes.append(helper.make_node("Identity", [counts[spec.block.layout]], count))
    graph.input.extend(kept)
    # The outputs' batch axis is the inputs' (1), expanded from an input's shape rather than a
    # constant one, so that ONNX Runtime keeps it dynamic, as Triton's backend wants where
    # max_batch_size > 0 (an Unsqueeze alone made it a fixed 1, which the backend refuses at
    # load). Expand, not Reshape: a Reshape to a shape holding 0 (n = 0) copies the input's size
    # there unless allowzero, which needs opset 14.
    batch = dim_of(names[binding.INPUTS[0].name], 0, "batch")
    output_nodes: list[typing.Any] = []
    del graph.output[:]
    for spec, wire, port in zip(binding.OUTPUTS, wires_out, output_ports, strict=True):
        tensor = names[spec.name]
        source_name = f"{MODEL_PREFIX}{port.name}"
        if list(wire.order) != sorted(wire.order):
            ordered = f"{_LAYER_PREFIX}{spec.name}.wire_order"
            output_nodes.append(
                helper.make_node("Transpose", [source_name], [ordered], perm=list(wire.order))
            )
            source_name = ordered
        one = f"{_LAYER_PREFIX}{spec.name}.one_event"
        axis = constant(f"{spec.name}.batch_axis", [0])
        output_nodes.append(helper.make_node("Unsqueeze", [source_name, axis], [one]))
        ones = constant(f"{spec.name}.ones", [1] * len(wire.dims))
        batched = f"{_LAYER_PREFIX}{spec.name}.batched_shape"
        output_nodes.append(helper.make_node("Concat", [batch, ones], [batched], axis=0))
        output_nodes.append(helper.make_node("Expand", [one, batched], [tensor]))
        graph.output.append(_wire_value(tensor, wire))
    graph.initializer.extend(constants)
    original = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *original, *output_nodes])
    onnx.checker.check_model(entry)
    return entry


def _storage_rows(
    tensor: str,
    wire: WireTensor,
    storage: BlockStorage,
    nodes: list[typing.Any],
    constant: typing.Callable[[str, Sequence[int]], str],
    binding_name: str,
) -> str:
    """The nodes turning wire tensor `tensor` ([1, *wire dims]) into the block's storage rows
    `[R, values]`, named as the adapted graph's input for them; that name."""
    from onnx import helper

    stored = f"{MODEL_PREFIX}soagen.{binding_name}"
    # The wire tensor's axes (batch axis first) in storage order: differs only for packed columns.
    perm = [0, *(1 + wire.order.index(axis) for axis in storage.order)]
    source = tensor
    if perm != sorted(perm):
        source = f"{_LAYER_PREFIX}{binding_name}.storage_order"
        nodes.append(helper.make_node("Transpose", [tensor], [source], perm=perm))
    nodes.append(
        helper.make_node(
            "Reshape", [source, constant(f"{binding_name}.rows", [storage.rows, -1])], [stored]
        )
    )
    return stored


def _wire_value(name: str, wire: WireTensor) -> typing.Any:
    """The graph input or output of a wire tensor: the batch axis and each element axis dynamic."""
    from onnx import helper

    dims: list[int | str] = [BATCH_DIM]
    dims += [f"{name}_n" if size == -1 else size for size in wire.dims]
    return helper.make_tensor_value_info(name, ONNX_ELEMENT_TYPES[wire.dtype], dims)
