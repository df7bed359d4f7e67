"""How a binding's block travels to and from a Triton server: name, datatype, axis order, dims.

Pure Python (no torch, NumPy or tritonclient), so the servers, the client and tools agree on one
definition: `soagen serve` and the Python-backend repositories of `soagen triton` (their
`config.pbtxt`, built from the schema by `schema_wire_tensor`, and their `model.py`) speak it, and
`Model.remote` sends it. Only the libtorch repositories of `soagen triton --backend pytorch` keep
the declared axis order (`declared_order`) without a batch axis: the TorchScript model takes its
tensors as they come.

Axis order. A block is a strided view of the SoA buffer: in `Nodes{x, y, z, energy} as [n, c]` the
element axis runs fastest in memory (stride 1) and each member is one contiguous column. Triton takes
C-contiguous tensors, so a block travels in its *storage order*: its axes sorted by falling stride,
the element axis last (`[c, n]` here, `[100, 20, n]` for a `[n, 20, 100]` array column). Copying a
block into the request is then one contiguous copy per member column (a `memcpy` of `n` items), not a
transpose, and the receiver's view back in declared order has exactly the SoA strides but for the
padding. A CMSSW producer's buffer has the same storage order, so a C++ client (SONIC) sends its
columns as they are.

Batch axis. Each request is one event: the tensor's first axis is Triton's batch axis, of size 1
(`max_batch_size` >= 1, so the configuration's dims leave it out). Triton's dynamic batcher gathers
concurrent events (of any element counts: the inputs allow ragged batches) into one execution; the
server runs the model once per event (see `soagen.serving.server`), or, in a `soagen triton`
repository written with `--merge-events`, once per execution.

bfloat16 travels as its raw 16-bit patterns (`UINT16`): NumPy has no bfloat16, and the server and
the client reinterpret the bits without converting them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from soagen.dsl.dtypes import DTYPES
from soagen.dsl.ir import Binding
from soagen.dsl.layout import block_view
from soagen.runtime.spec import BindingSpec

# Triton's name for each dtype of the .soa language.
TRITON_DATATYPES: dict[str, str] = {
    "bool": "BOOL",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "float16": "FP16",
    "bfloat16": "UINT16",  # raw bits: see the module documentation
    "float32": "FP32",
    "float64": "FP64",
}

# An element count at which every pitch exceeds 1 element, so strides sort the axes unambiguously.
_PROBE_ELEMENTS = 1000

# `soagen serve`'s one output besides the binding's: per event, empty, or the error that event
# raised. PyTriton fails every event of an execution when its function raises, so an event that
# fails among others is answered with its error here (and placeholder outputs), and the others keep
# their results. Soagen's client requests it when the server declares it and raises the error.
ERROR_OUTPUT = "soagen_error"

# Events a served model's execution gathers at most, and how long Triton's dynamic batcher waits
# for more, unless told otherwise (for `soagen serve` and `soagen triton` alike).
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_QUEUE_DELAY_US = 500


@dataclass(frozen=True, slots=True)
class WireTensor:
    """One binding as a Triton tensor.

    `order[i]` is the block axis that wire axis `i` holds; `dims` are the wire axes' sizes with -1
    for the element axis (Triton's batch axis comes before them and is not listed).
    """

    name: str
    direction: str
    layout: str
    dtype: str  # the .soa dtype
    datatype: str  # Triton's
    numpy_dtype: str  # NumPy's attribute name: "uint16" for bfloat16
    axes: tuple[str, ...]  # the block's axes, in declared order
    order: tuple[int, ...]
    dims: tuple[int, ...]
    batched: bool = True  # a leading batch axis of 1 (the server batches events)
    scalars: bool = False  # a block of scalars: one value per collection, stride 0 along n

    @property
    def inverse(self) -> tuple[int, ...]:
        """The permutation from wire order back to declared order."""
        back = [0] * len(self.order)
        for wire_axis, block_axis in enumerate(self.order):
            back[block_axis] = wire_axis
        return tuple(back)

    @property
    def element_axis(self) -> int | None:
        """The wire axis (batch axis not counted) that runs over elements, or None."""
        return self.order.index(self.axes.index("n")) if "n" in self.axes else None

    def wire_shape(self, declared_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape a block of `declared_shape` travels in, batch axis included."""
        shape = tuple(declared_shape[axis] for axis in self.order)
        return (1, *shape) if self.batched else shape

    def one_value(self) -> WireTensor:
        """The tensor of a block of scalars sent once per event (`soagen triton`'s Python backend):
        1 on the element axis."""
        return replace(self, dims=tuple(1 if size == -1 else size for size in self.dims))

    @property
    def is_one_value(self) -> bool:
        """Whether this tensor carries a block of scalars once per event (`one_value`)."""
        return self.scalars and -1 not in self.dims and "n" in self.axes

    def shape_text(self, batch: str = "1") -> str:
        """`[1, 4, n]`: the shape of the tensor a request carries, batch axis first."""
        dims = ["n" if size == -1 else str(size) for size in self.dims]
        return f"[{', '.join([batch, *dims] if self.batched else dims)}]"

    def describe(self) -> str:
        """`node_features: FP32 [1, 4, n]`: the tensor a request carries, batch axis first."""
        return f"{self.name}: {self.datatype} {self.shape_text()}"

    def shape_problem(self, shape: Sequence[int], events: int | None = 1) -> str | None:
        """Why a request's tensor of `shape` (batch axis included) is not this tensor, or None.
        `events`: the size the batch axis must have (None: any)."""
        wire = tuple(shape[1:] if self.batched else shape)
        if not dims_match(wire, self.dims) or (
            self.batched and events is not None and shape[0] != events
        ):
            expected = self.shape_text("b" if events is None else str(events))
            return f"has shape {list(shape)}, expected {expected} (n: any element count)"
        return None


def dims_match(shape: Sequence[int], dims: Sequence[int]) -> bool:
    """Whether `shape` has the rank and the sizes of `dims`, where -1 (the element axis) takes any
    size."""
    return len(shape) == len(dims) and all(
        want == -1 or got == want for got, want in zip(shape, dims, strict=True)
    )


def wire_tensor(spec: BindingSpec) -> WireTensor:
    """The wire form of one input or output binding."""
    block = spec.block
    probe = block.view(_PROBE_ELEMENTS)
    return _wire_tensor(
        spec.name, spec.direction, block.layout, block.dtype, block.axes, probe.shape, probe.strides
    )


def schema_wire_tensor(binding: Binding, direction: str) -> WireTensor:
    """The wire form of a binding of a checked schema, as `wire_tensor` gives it for the generated
    binding (no generated code needed: `soagen triton` writes its configuration from this)."""
    layout, first = binding.layout, binding.first_member
    shape, strides, _ = block_view(binding).evaluate(_PROBE_ELEMENTS, layout.align)
    return _wire_tensor(
        binding.name, direction, layout.name, first.dtype_name, binding.axis_names, shape, strides
    )


def _wire_tensor(
    name: str,
    direction: str,
    layout: str,
    dtype: str,
    axes: tuple[str, ...],
    shape: tuple[int, ...],
    strides: tuple[int, ...],
) -> WireTensor:
    """The wire form of a block of `axes` whose view of `_PROBE_ELEMENTS` elements has `shape` and
    `strides`."""

    def sort_key(axis: int) -> tuple[bool, int, int]:
        return (axes[axis] == "n", -strides[axis], axis)

    order = tuple(sorted(range(len(axes)), key=sort_key))
    dims = tuple(-1 if axes[axis] == "n" else shape[axis] for axis in order)
    scalars = "n" in axes and strides[axes.index("n")] == 0
    return WireTensor(
        name=name,
        direction=direction,
        layout=layout,
        dtype=dtype,
        datatype=TRITON_DATATYPES[dtype],
        numpy_dtype=DTYPES[dtype].numpy_name,
        axes=axes,
        order=order,
        dims=dims,
        scalars=scalars,
    )


def wire_tensors(specs: tuple[BindingSpec, ...]) -> tuple[WireTensor, ...]:
    return tuple(wire_tensor(spec) for spec in specs)


def declared_order(wire: WireTensor) -> WireTensor:
    """The same binding with its axes in declared order (`[n, 4]` for `as [n, c]`), as a libtorch
    model repository (`soagen triton --backend pytorch`) has it."""
    dims = [0] * len(wire.order)
    for wire_axis, block_axis in enumerate(wire.order):
        dims[block_axis] = wire.dims[wire_axis]
    return replace(wire, order=tuple(range(len(wire.order))), dims=tuple(dims))
