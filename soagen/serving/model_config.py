"""The `config.pbtxt` of a schema's model: a torch-free model of Triton's model configuration, built
from the checked IR, validated against Triton's rules and rendered as text protobuf.

Tensors. Each binding becomes one Triton tensor of the binding's block, with -1 for the element
axis `n` (the only variable one) and the block's fixed extents (`c`, array extents) as numbers.
The Python backend's tensors are the blocks' wire form, the one `soagen serve` speaks
(`soagen.serving.wire`): axes in storage order (`node_features` of `as [n, c]` as `[4, -1]`, each
column contiguous, as a CMSSW producer's buffer holds it) and bfloat16 as its raw bits
(`TYPE_UINT16`). The PyTorch backend hands the tensors to the TorchScript model as they come, so
its tensors keep the declared axis order (`[-1, 4]`) and dtype (`TYPE_BF16`, which that backend
lacks). An input block of scalars broadcasts over `n` in the model, so its Python-backend tensor
carries the one value per event: 1 on that axis.

Events and batching. One request carries one event: the blocks of its collections, whose element
counts differ from event to event. Triton's ordinary batching stacks requests along a new first
axis, which only works for equal shapes. The Python backend's inputs are ragged inputs
(`allow_ragged_batch`), as `soagen serve`'s: `max_batch_size` is at least 1 (64 by default), each
request's tensors carry Triton's leading batch axis (one event per entry, usually 1), the dynamic
batcher gathers requests whatever their element counts, and the backend's `model.py` runs the
gathered events one by one, or, with `merge_events`, as one concatenation along each collection's
element axis, splitting the outputs back per request (see `soagen.serving.python_model`). The
PyTorch backend would hand ragged inputs to the model flattened into 1-D tensors, which a model
written for SoA blocks does not take, so it keeps `max_batch_size` 0: one request at a time.

The onnxruntime backend's tensors are the wire form too (its model.onnx is adapted to take them:
`soagen.serving.onnx_entry`), with `max_batch_size` 1 and no dynamic batching: one event per
request, the wire's batch axis of 1, since Triton would stack only events of equal shapes.

Names. The Python backend maps names itself, so its tensors are named after the bindings
("schema"), or `<binding>__<i>` ("index"). Triton's PyTorch backend binds config names to the
TorchScript `forward` either by the `<name>__<index>` convention ("index", the default there:
`node_features__0`, ..., `edge_scores__0`) or, for inputs, by the forward's argument names
("forward"); outputs then keep the index convention.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import soagen
from soagen.build.errors import CommandError
from soagen.dsl.ir import Binding, MemberKind, Model, Schema
from soagen.generator.pyformat import comment_text
from soagen.serving import events
from soagen.serving.wire import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_DELAY_US,
    TRITON_DATATYPES,
    WireTensor,
    declared_order,
    schema_wire_tensor,
)

# soagen dtype -> Triton's data type of the dtype itself (the PyTorch backend's tensors); the
# Python backend's tensors have their wire datatype (`TYPE_` + TRITON_DATATYPES: bfloat16's bits).
TRITON_TYPES: dict[str, str] = {
    dtype: f"TYPE_{datatype}" for dtype, datatype in TRITON_DATATYPES.items()
} | {"bfloat16": "TYPE_BF16"}
# Every data type Triton's model configuration knows (TYPE_STRING: bytes, which soagen never uses).
VALID_TYPES = frozenset(TRITON_TYPES.values()) | {"TYPE_STRING"}
# What Triton's PyTorch (libtorch) backend converts to torch tensors (libtorch_utils.cc).
LIBTORCH_TYPES = frozenset(
    {
        "TYPE_BOOL",
        "TYPE_UINT8",
        "TYPE_INT8",
        "TYPE_INT16",
        "TYPE_INT32",
        "TYPE_INT64",
        "TYPE_FP16",
        "TYPE_FP32",
        "TYPE_FP64",
    }
)
# The model file of backends that run one file.
MODEL_FILES = {"pytorch": "model.pt", "onnxruntime": "model.onnx"}
INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL")
BACKENDS = ("python", "pytorch", "onnxruntime")
# Backends whose tensors are the wire form of `soagen serve` (storage order, batch axis first).
WIRE_BACKENDS = ("python", "onnxruntime")
# ONNX Runtime's threads per session in an onnxruntime entry: soagen's defaults (one each, as CMSSW
# runs models inside its own thread pool), as Triton's onnxruntime backend's parameters.
ONNXRUNTIME_THREADS = (("intra_op_thread_count", "1"), ("inter_op_thread_count", "1"))
NAMINGS = ("schema", "index", "forward")
# What the Python backend's model.py runs: soagen's backends.
RUNTIMES = ("eager", "torchscript", "compile", "aot")
DEFAULT_NAMING = {"python": "schema", "pytorch": "index", "onnxruntime": "schema"}

_NAMED_INDEX = re.compile(r"^.+__(\d+)$")
# Model names are folder names in the repository; keep them portable.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class TritonError(CommandError):
    """`soagen triton` cannot go on; `usage` marks a wrong argument (exit 2) rather than a model
    that cannot be written (exit 1)."""


class ConfigError(TritonError):
    """A model configuration that breaks Triton's rules; `problems` lists every one."""

    def __init__(self, name: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"the Triton config of {name!r} is invalid: " + "; ".join(self.problems))


@dataclass(frozen=True, slots=True)
class TensorConfig:
    """One `input` or `output` entry."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    # Positions where the shape varies from request to request (the element axis): only these may
    # be -1.
    variable: tuple[int, ...] = ()
    allow_ragged_batch: bool = False
    comment: str = ""


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    kind: str
    count: int = 1
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    instance_groups: tuple[InstanceGroup, ...]
    # None: no `dynamic_batching` block; else its max_queue_delay_microseconds.
    dynamic_batching: int | None = None
    default_model_filename: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    header: tuple[str, ...] = field(default=(), compare=False)  # comment lines at the top


def validate(config: ModelConfig) -> list[str]:
    """Every way `config` breaks Triton's rules (or would not load in its backend), as sentences."""
    problems: list[str] = []
    if not _MODEL_NAME.match(config.name):
        problems.append(
            f"model name {config.name!r} must be a folder name of letters, digits, `_`, `.` and `-`"
        )
    if config.backend not in BACKENDS:
        problems.append(f"backend {config.backend!r} is not one of {', '.join(BACKENDS)}")
    if config.max_batch_size < 0:
        problems.append(f"max_batch_size is {config.max_batch_size}; it must be 0 or more")
    if config.dynamic_batching is not None:
        if config.max_batch_size == 0:
            problems.append("dynamic_batching needs max_batch_size > 0")
        if config.dynamic_batching < 0:
            problems.append("dynamic_batching: max_queue_delay_microseconds must be 0 or more")
    for role, tensors in (("input", config.inputs), ("output", config.outputs)):
        if not tensors:
            problems.append(f"a model needs at least one {role}")
        for tensor in tensors:
            problems += _tensor_problems(config, role, tensor)
    seen: dict[str, str] = {}
    for role, tensors in (("input", config.inputs), ("output", config.outputs)):
        for tensor in tensors:
            if tensor.name in seen:
                problems.append(
                    f"{role} {tensor.name!r}: the name is already an {seen[tensor.name]}"
                )
            else:
                seen[tensor.name] = role
    if config.backend == "pytorch":
        problems += _libtorch_naming_problems(config)
    if not config.instance_groups:
        problems.append("instance_group: at least one group is needed")
    for group in config.instance_groups:
        if group.kind not in INSTANCE_KINDS:
            problems.append(
                f"instance_group kind {group.kind!r} is not one of {', '.join(INSTANCE_KINDS)}"
            )
        if group.count < 1:
            problems.append(f"instance_group count is {group.count}; it must be at least 1")
        if group.gpus and group.kind != "KIND_GPU":
            problems.append(f"instance_group: gpus are only for KIND_GPU, not {group.kind}")
        if any(gpu < 0 for gpu in group.gpus) or len(set(group.gpus)) != len(group.gpus):
            problems.append(f"instance_group gpus {list(group.gpus)}: distinct indices >= 0")
    return problems


def _tensor_problems(config: ModelConfig, role: str, tensor: TensorConfig) -> list[str]:
    where = f"{role} {tensor.name!r}"
    problems = []
    if not tensor.name:
        problems.append(f"an {role} has an empty name")
    if tensor.data_type not in VALID_TYPES:
        problems.append(f"{where}: data type {tensor.data_type!r} is not a Triton TYPE_*")
    elif config.backend == "pytorch" and tensor.data_type not in LIBTORCH_TYPES:
        problems.append(
            f"{where}: Triton's PyTorch backend has no {tensor.data_type}; serve it with the "
            f"Python backend"
        )
    if not tensor.dims:
        problems.append(f"{where}: dims is empty; a tensor has rank 1 or more")
    for axis, size in enumerate(tensor.dims):
        if size == -1 and axis not in tensor.variable:
            problems.append(f"{where}: dims {list(tensor.dims)}: axis {axis} is fixed, not -1")
        elif size != -1 and size < 1:
            problems.append(
                f"{where}: dims {list(tensor.dims)}: axis {axis} is {size}; a dimension is at "
                f"least 1, or -1 where it varies"
            )
    if tensor.allow_ragged_batch:
        if config.backend == "onnxruntime":
            problems.append(
                f"{where}: Triton's onnxruntime backend passes ragged inputs flattened to 1-D; "
                f"use the Python backend to batch events"
            )
        if role == "output":
            problems.append(f"{where}: allow_ragged_batch is for inputs")
        if config.max_batch_size == 0:
            problems.append(f"{where}: allow_ragged_batch needs max_batch_size > 0")
        if config.backend == "pytorch":
            problems.append(
                f"{where}: Triton's PyTorch backend passes ragged inputs flattened to 1-D, which a "
                f"model of SoA blocks does not take; use the Python backend to batch events"
            )
    return problems


def _libtorch_naming_problems(config: ModelConfig) -> list[str]:
    """The PyTorch backend reads `<name>__<index>` names as positions: where every name of a role
    follows it, the indices must be exactly 0..k-1; outputs have no other mapping than that one or
    the config order."""
    problems = []
    for role, tensors in (("input", config.inputs), ("output", config.outputs)):
        matches = [_NAMED_INDEX.match(tensor.name) for tensor in tensors]
        if not all(matches):
            continue
        indices = sorted(int(match.group(1)) for match in matches if match)
        if indices != list(range(len(tensors))):
            names = ", ".join(tensor.name for tensor in tensors)
            problems.append(
                f"{role}s {names}: `<name>__<index>` names must number the {role}s 0 to "
                f"{len(tensors) - 1}, once each"
            )
    return problems


def check(config: ModelConfig) -> ModelConfig:
    """`config` itself, or ConfigError listing every problem."""
    problems = validate(config)
    if problems:
        raise ConfigError(config.name, problems)
    return config


def render(config: ModelConfig) -> str:
    """`config.pbtxt` text: the same config gives the same bytes. Checks the config first."""
    check(config)
    lines = [f"# {line}".rstrip() for line in config.header]
    if lines:
        lines.append("")
    lines.append(f"name: {_string(config.name)}")
    lines.append(f"backend: {_string(config.backend)}")
    if config.default_model_filename is not None:
        lines.append(f"default_model_filename: {_string(config.default_model_filename)}")
    lines.append(f"max_batch_size: {config.max_batch_size}")
    for role, tensors in (("input", config.inputs), ("output", config.outputs)):
        lines.append(f"{role} [")
        for position, tensor in enumerate(tensors):
            if tensor.comment:
                lines.append(f"  # {tensor.comment}")
            lines.append("  {")
            lines.append(f"    name: {_string(tensor.name)}")
            lines.append(f"    data_type: {tensor.data_type}")
            lines.append(f"    dims: [ {', '.join(str(size) for size in tensor.dims)} ]")
            if tensor.allow_ragged_batch:
                lines.append("    allow_ragged_batch: true")
            lines.append("  }" + ("," if position < len(tensors) - 1 else ""))
        lines.append("]")
    lines.append("instance_group [")
    for position, group in enumerate(config.instance_groups):
        lines.append("  {")
        lines.append(f"    count: {group.count}")
        lines.append(f"    kind: {group.kind}")
        if group.gpus:
            lines.append(f"    gpus: [ {', '.join(str(gpu) for gpu in group.gpus)} ]")
        lines.append("  }" + ("," if position < len(config.instance_groups) - 1 else ""))
    lines.append("]")
    if config.dynamic_batching is not None:
        lines.append("dynamic_batching {")
        lines.append(f"  max_queue_delay_microseconds: {config.dynamic_batching}")
        lines.append("}")
    for key, value in config.parameters:
        lines.append("parameters {")
        lines.append(f"  key: {_string(key)}")
        lines.append(f"  value: {{ string_value: {_string(value)} }}")
        lines.append("}")
    return "\n".join(lines) + "\n"


def _string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


# Building a config from the schema.


@dataclass(frozen=True, slots=True)
class Options:
    """How to serve the model; the defaults serve it on one CPU instance, one event per request,
    gathering up to DEFAULT_MAX_BATCH_SIZE requests per execution (Python backend)."""

    backend: str = "python"
    naming: str | None = None  # None: DEFAULT_NAMING of the backend
    name: str | None = None  # the Triton model name; None: the schema's model name
    max_batch_size: int | None = None  # None: DEFAULT_MAX_BATCH_SIZE (python), 0 (pytorch)
    max_queue_delay_us: int = DEFAULT_MAX_QUEUE_DELAY_US
    merge_events: bool = False
    kind: str = "cpu"  # "cpu" or "gpu"
    count: int = 1
    gpus: tuple[int, ...] = ()
    # The TorchScript forward's argument names, for naming "forward".
    forward_names: tuple[str, ...] | None = None


def find_model(schema: Schema, name: str, schema_path: str) -> Model:
    models = schema.models
    if name not in models:
        raise TritonError(schema.unknown_model(name, schema_path), usage=True)
    return models[name]


def is_scalar_block(binding: Binding) -> bool:
    return binding.first_member.kind is MemberKind.SCALAR


def block_text(binding: Binding) -> str:
    members = ", ".join(binding.member_names)
    axes = ", ".join(binding.axis_names)
    return f"{binding.layout_name}{{{members}}} as [{axes}], {binding.first_member.dtype_name}"


def tensor_names(model: Model, options: Options) -> dict[str, str]:
    """Binding name -> Triton tensor name."""
    naming = options.naming or DEFAULT_NAMING.get(options.backend, "schema")
    if naming not in NAMINGS:
        raise TritonError(
            f"--naming must be one of {', '.join(NAMINGS)}, got {naming!r}", usage=True
        )
    names: dict[str, str] = {}
    for role in (model.inputs, model.outputs):
        for position, binding in enumerate(role):
            if naming == "index" or (naming == "forward" and binding in model.outputs):
                names[binding.name] = f"{binding.name}__{position}"
            elif naming == "schema":
                names[binding.name] = binding.name
    if naming == "forward":
        forward = options.forward_names
        if forward is None:
            raise TritonError(
                "--naming forward needs the model's forward argument names: give --factory "
                "(or a TorchScript file)",
                usage=True,
            )
        if len(forward) != len(model.inputs):
            raise TritonError(
                f"--naming forward: the model's forward takes {len(forward)} tensor(s) "
                f"({', '.join(forward) or 'none'}); {model.name} declares {len(model.inputs)} "
                f"input(s) ({', '.join(b.name for b in model.inputs)})",
                usage=True,
            )
        for binding, argument in zip(model.inputs, forward, strict=True):
            names[binding.name] = argument
        if options.backend == "python":
            for binding in model.outputs:
                names[binding.name] = binding.name
    return names


def build_config(
    schema: Schema, model_name: str, options: Options, *, schema_path: str | None = None
) -> ModelConfig:
    """The checked config for one model of `schema`; TritonError for options that do not fit."""
    path = schema_path or schema.root.path
    model = find_model(schema, model_name, path)
    if options.backend not in BACKENDS:
        raise TritonError(
            f"--backend must be one of {', '.join(BACKENDS)}, got {options.backend!r}", usage=True
        )
    if options.kind not in ("cpu", "gpu"):
        raise TritonError(f"--device must be cpu or gpu, got {options.kind!r}", usage=True)
    python = options.backend == "python"
    onnxruntime = options.backend == "onnxruntime"
    wire_form = options.backend in WIRE_BACKENDS
    max_batch_size = max_batch_size_of(options)
    if onnxruntime and max_batch_size != 1:
        raise TritonError(
            f"--max-batch-size {max_batch_size}: an onnxruntime entry takes one event per "
            f"request, with the Python-backend entry's batch axis of 1 (max_batch_size 1); "
            f"Triton would stack events only of equal element counts, so batch events with "
            f"--backend python",
            usage=True,
        )
    if onnxruntime and options.naming == "forward":
        raise TritonError(
            "--naming forward names tensors after a TorchScript forward's arguments; an "
            "onnxruntime entry's are named after the bindings (schema) or by index",
            usage=True,
        )
    if onnxruntime:
        for binding in (*model.inputs, *model.outputs):
            if binding.first_member.dtype_name == "bfloat16":
                raise TritonError(
                    f"{binding.name!r} holds bfloat16, which the wire carries as its UINT16 bits "
                    f"and an ONNX graph cannot reinterpret; serve it with --backend python",
                    usage=True,
                )
    if max_batch_size and not wire_form:
        raise TritonError(
            "--max-batch-size: Triton's PyTorch backend hands ragged (variable element count) "
            "inputs to the model flattened to 1-D, which a model of SoA blocks does not take; "
            "batch events with --backend python",
            usage=True,
        )
    if options.merge_events and not python:
        raise TritonError(
            "--merge-events merges the requests the dynamic batcher gathers, which only "
            "--backend python does",
            usage=True,
        )
    if python and max_batch_size < 1:
        raise TritonError(
            f"--max-batch-size {max_batch_size}: the Python backend's requests carry Triton's "
            f"batch axis (one event each, as soagen serve's do), so it needs N >= 1 (1: one "
            f"event per execution)",
            usage=True,
        )
    if options.merge_events:
        for binding in model.inputs:
            if is_scalar_block(binding):
                raise TritonError(
                    f"--merge-events: input {binding.name!r} binds scalars of "
                    f"{binding.layout_name}, one value per event, which one merged collection "
                    f"cannot hold for several events",
                    usage=True,
                )
    if wire_form:
        counted = {b.layout_name for b in model.inputs if not is_scalar_block(b)}
        for binding in model.inputs:
            if binding.layout_name not in counted:
                raise TritonError(
                    f"input {binding.name!r} binds scalars of {binding.layout_name}, and no "
                    f"other input gives {binding.layout_name}'s element count per event; bind a "
                    f"column of it too, or serve the model with --backend pytorch",
                    usage=True,
                )
    names = tensor_names(model, options)
    # Ragged inputs and the dynamic batcher: the Python backend's model.py separates the events.
    batched = max_batch_size > 0 and python

    def tensor(binding: Binding, role: str) -> TensorConfig:
        wire = tensor_wire(binding, role, wire_form)
        scalar = is_scalar_block(binding) and role == "input" and wire_form
        variable = () if scalar else tuple(i for i, size in enumerate(wire.dims) if size == -1)
        comment = f"{binding.name}: {block_text(binding)}"
        if wire.order != tuple(range(len(wire.order))):
            comment += f"; sent as [{', '.join(wire.axes[axis] for axis in wire.order)}]"
        if scalar:
            comment += " (scalars: one value per event)"
        if wire_form and wire.dtype == "bfloat16":
            comment += " (bfloat16 as its raw bits)"
        return TensorConfig(
            name=names[binding.name],
            data_type=f"TYPE_{wire.datatype}" if wire_form else TRITON_TYPES[wire.dtype],
            dims=wire.dims,
            variable=variable,
            allow_ragged_batch=batched and role == "input",
            comment=comment,
        )

    kind = "KIND_GPU" if options.kind == "gpu" else "KIND_CPU"
    config = ModelConfig(
        name=options.name or model.name,
        backend=options.backend,
        max_batch_size=max_batch_size,
        inputs=tuple(tensor(binding, "input") for binding in model.inputs),
        outputs=tuple(tensor(binding, "output") for binding in model.outputs),
        instance_groups=(InstanceGroup(kind, options.count, options.gpus),),
        dynamic_batching=options.max_queue_delay_us if batched else None,
        default_model_filename=MODEL_FILES.get(options.backend),
        parameters=ONNXRUNTIME_THREADS if onnxruntime else (),
        header=_header(model, path, options, max_batch_size),
    )
    return check(config)


def max_batch_size_of(options: Options) -> int:
    """`options.max_batch_size`, or its backend's default."""
    if options.max_batch_size is not None:
        return options.max_batch_size
    return {"python": DEFAULT_MAX_BATCH_SIZE, "onnxruntime": 1}.get(options.backend, 0)


def tensor_wire(binding: Binding, role: str, wire_form: bool) -> WireTensor:
    """How a binding's tensor travels: the wire form (Python and onnxruntime backends), or its
    declared axes without a batch axis (PyTorch backend). A scalar input's one value is written
    into the collection (Python) or expanded in the graph (onnxruntime), where the model sees it
    broadcast over n: its tensor has 1 on the element axis."""
    wire = schema_wire_tensor(binding, role)
    if not wire_form:
        return replace(declared_order(wire), batched=False)
    if role == "input" and is_scalar_block(binding):
        return wire.one_value()
    return wire


def _header(
    model: Model, schema_path: str, options: Options, max_batch_size: int
) -> tuple[str, ...]:
    if options.backend == "onnxruntime":
        text = (
            "One request is one event: each input is one SoA block of the event's collections in "
            "the wire form of `soagen serve` (soagen.serving.wire): axes in storage order, -1 on "
            "the element axis (n), after Triton's batch axis of 1; the outputs come back the same "
            "way. model.onnx is the user's ONNX model adapted by soagen to take and return these "
            "tensors (soagen.serving.onnx_entry). max_batch_size 1, no dynamic batching: Triton "
            "stacks only equal shapes, and events have different element counts."
        )
    elif max_batch_size == 0:
        text = (
            "One request is one event: each input is one SoA block of the event's collections in "
            "its declared axis order, -1 on its element axis (n); the outputs come back the same "
            "way. max_batch_size 0: events have different element counts, which Triton's batching "
            "cannot stack, so the model takes one request at a time."
        )
    else:
        how = (
            "as one concatenation along each collection's element axis (index inputs shifted), "
            "splitting the outputs per request"
            if options.merge_events
            else "one by one"
        )
        text = (
            "One request is one event: each input is one SoA block of the event's collections in "
            "the wire form of `soagen serve` (soagen.serving.wire): axes in storage order, -1 on "
            "the element axis (n), bfloat16 as UINT16 bits, after Triton's batch axis (b events "
            "of equal shapes, usually b = 1); the outputs come back the same way. "
            f"max_batch_size {max_batch_size}, ragged inputs: the dynamic batcher gathers "
            f"requests whatever their element counts, and model.py runs the gathered events {how}."
        )
    return (
        f"Written by soagen {soagen.__version__} (`soagen triton`) for model {model.name} of "
        f"{comment_text(schema_path)}: do not edit.",
        "Write it again with `soagen triton` after changing the schema.",
        "",
        *textwrap.wrap(text, width=98),
    )


def output_sizes(
    schema: Schema,
    model_name: str,
    given: Mapping[str, str],
    *,
    schema_path: str | None = None,
) -> dict[str, dict[str, object]]:
    """How many elements each output's collection gets per event, for the Python backend
    (`soagen.serving.events.output_sizes`, with the model's bindings from the schema)."""
    path = schema_path or schema.root.path
    model = find_model(schema, model_name, path)
    try:
        return events.output_sizes(
            model.name,
            [(binding.name, binding.layout_name) for binding in model.inputs],
            [(binding.name, binding.layout_name) for binding in model.outputs],
            given,
        )
    except events.OutputSizeError as error:
        raise TritonError(str(error), usage=True) from None
