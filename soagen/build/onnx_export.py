"""`soagen compile -o MODEL.onnx`: a factory's model as an ONNX file whose inputs take the blocks'
storage, for soagen's ONNX Runtime backend.

The model is exported for contiguous tensors in each binding's declared order (`torch.onnx.export`,
the TorchScript-based exporter: it needs no network and takes seconds, with a dynamic element axis
per layout), then given the storage inputs the runtime's adaptation gives any ONNX file
(`soagen.runtime.onnx_graph.adapt`: each input is its block's `[rows, pitch]` storage plus one ranges
input; the slice and the single-axis transposes into the declared order are nodes of the graph).
The file records the binding and geometry it takes in its metadata_props, so that loading it
adapts nothing and compares with no original model, and refuses another schema's binding. Before
it is written it is loaded as users load it and compared with the eager model on real collections
at several element counts (`soagen.build.model.trial_sizes`): a disagreement is a CommandError and
no file is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import typing
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from soagen.build.compile import CompileError, example_outputs
from soagen.build.model import (
    ExampleFill,
    SchemaOrder,
    Trial,
    build_model,
    check_agreement,
    check_eager,
    check_finite,
    eager_trials,
    example_inputs,
    example_sizes,
    forget_generated_modules,
    generated_binding,
    load_examples,
    resolve_index_bounds,
    same_n_groups,
)
from soagen.runtime.collection import Collection
from soagen.runtime.model import ModelBinding
from soagen.runtime.spec import following_input

Progress = Callable[[str], None]

# The ONNX opset exported: 13 is the adaptation's least (Slice and Split with tensor inputs).
OPSET = 17


def export_onnx(
    schema_path: str | os.PathLike[str],
    model_name: str,
    factory: str,
    *,
    output: str | os.PathLike[str],
    index_bounds: Mapping[str, str] | None = None,
    examples: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Build `factory()` ("path/to/file.py:function"), export it for binding `model_name` of the
    schema as an ONNX file taking the blocks' storage, check it against the eager model and write
    it to `output` (`.onnx`). `index_bounds` and `examples` as for `compile_model`. Raises
    `SchemaError` for schema errors and `CommandError` for everything else."""
    target = Path(output)
    if target.suffix != ".onnx":
        raise CompileError(f"the output must be an .onnx file, got {str(target)!r}", usage=True)
    if target.is_dir():
        raise CompileError(f"--output {target}: a folder of that name exists", usage=True)
    report = progress or (lambda line: None)
    fill = None if examples is None else load_examples(examples)
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="soagen-onnx-") as workdir:
        binding, layouts = generated_binding(Path(schema_path), model_name, Path(workdir))
        try:
            model, module = build_model(factory, device)
            bounds = resolve_index_bounds(binding, index_bounds, module)
            reference = SchemaOrder(model, binding)
            sizes = example_sizes(binding, layouts)
            inputs = example_inputs(binding, layouts, sizes, bounds, device, seed=0, fill=fill)
            results, _ = check_eager(binding, reference, inputs)
            check_finite(binding, results, sizes, fill)
            trials = eager_trials(binding, layouts, reference, sizes, bounds, device, fill)
            counts = measured_output_counts(binding, trials)
            report(f"exporting {model_name} with torch.onnx.export (opset {OPSET})")
            declared = _export(binding, reference, inputs, Path(workdir) / "declared.onnx")
            adapted = _with_storage_inputs(binding, declared, counts)
            target.parent.mkdir(parents=True, exist_ok=True)
            # Written beside the target and moved into place once checked: no unchecked file.
            staging = target.with_name(f".{target.stem}.{uuid.uuid4().hex[:8]}.onnx")
            try:
                staging.write_bytes(adapted)
                report("checking the ONNX file against the eager model")
                verify(binding, layouts, staging, trials, counts, fill)
                os.replace(staging, target)
            finally:
                staging.unlink(missing_ok=True)
        finally:
            forget_generated_modules(binding)
    return target


def _export(
    binding: type[ModelBinding],
    model: SchemaOrder,
    inputs: Sequence[torch.Tensor],
    path: Path,
) -> typing.Any:
    """The model exported for contiguous inputs in declared order, each layout's element axis a
    dynamic dimension of its own (`same n as` groups share one)."""
    import onnx

    groups = same_n_groups(binding)
    dynamic: dict[str, dict[int, str]] = {}
    for spec in (*binding.INPUTS, *binding.OUTPUTS):
        axes = spec.block.axes
        if "n" in axes:
            layout = groups.get(spec.block.layout, spec.block.layout)
            dynamic[spec.name] = {axes.index("n"): f"n_{layout}"}
    arguments = tuple(view.contiguous() for view in inputs)
    text = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(text), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's notes on Python control flow
            torch.onnx.export(
                model,
                arguments,
                str(path),
                dynamo=False,
                opset_version=OPSET,
                input_names=[spec.name for spec in binding.INPUTS],
                output_names=[spec.name for spec in binding.OUTPUTS],
                dynamic_axes=dynamic,
            )
    except Exception as error:
        raise CompileError(
            f"torch.onnx.export cannot export the model for {binding.NAME}: "
            f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
        ) from error
    return onnx.load(str(path))


def _with_storage_inputs(
    binding: type[ModelBinding], model: typing.Any, output_counts: Mapping[str, str]
) -> bytes:
    """The exported model with the runtime's storage inputs and soagen's metadata, which records
    `output_counts` (see `measured_output_counts`)."""
    from soagen.runtime.onnx import OUTPUT_COUNTS_KEY, storage_metadata
    from soagen.runtime.onnx_graph import (
        METADATA_KEY,
        _ports,
        adapt,
        block_storage,
        match_ports,
    )

    graph = model.graph
    storages = {spec.name: block_storage(spec) for spec in (*binding.INPUTS, *binding.OUTPUTS)}
    initializers = {tensor.name for tensor in graph.initializer}
    inputs, outputs = match_ports(
        binding.NAME,
        binding,
        _ports(graph.input, initializers),
        _ports(graph.output),
        storages,
    )
    adapted = adapt(model, binding, inputs, outputs, storages, "staged")
    entry = adapted.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps({**storage_metadata(binding), OUTPUT_COUNTS_KEY: dict(output_counts)})
    return typing.cast(bytes, adapted.SerializeToString())


def measured_output_counts(binding: type[ModelBinding], trials: Sequence[Trial]) -> dict[str, str]:
    """Outputs whose element count was an input collection's at every trial (each layout had a
    count of its own there, one per `same n as` group), each with that input: one of the output's
    own layout where an input binds it, else the first in schema order. What a server that
    allocates the output collections sizes them by (`OnnxBackend.output_counts`). A count that
    stayed the same is not recorded: a model's data can keep it so (a selection on the trials'
    values), and one trial tells nothing."""
    counts: dict[str, str] = {}
    if len(trials) < 2:
        return counts
    for position, spec in enumerate(binding.OUTPUTS):
        if "n" not in spec.block.axes:
            continue
        axis = spec.block.axes.index("n")
        found = [trial.expected[position].shape[axis] for trial in trials]
        follows = [
            source
            for source in binding.INPUTS
            if [trial.sizes[source.block.layout] for trial in trials] == found
        ]
        if follows:
            counts[spec.name] = following_input(follows, spec).name
    return counts


def verify(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    path: Path,
    trials: Sequence[Trial],
    output_counts: Mapping[str, str],
    fill: ExampleFill | None,
) -> None:
    """Load the file as users will and compare it with the eager model's `trials` on the same
    collections; its recorded output counts must read back as `output_counts`. CommandError
    naming the first disagreement."""
    from soagen.runtime.errors import ModelLoadError
    from soagen.runtime.onnx import OnnxBackend

    device = torch.device("cpu")
    try:
        backend = OnnxBackend(path, binding)
    except ModelLoadError as error:
        raise CompileError(f"the ONNX file written does not load: {error}") from error
    if backend.output_counts != output_counts:
        raise CompileError(
            f"the ONNX file {path.name} reads back output counts {backend.output_counts}, "
            f"written as {dict(output_counts)}"
        )
    runner = backend.on(device)
    for trial in trials:
        actual = example_outputs(binding, layouts, trial.expected, device)
        for view in actual:
            view.fill_(-7)  # so that an output the file does not write shows
        with torch.inference_mode():
            runner([*trial.inputs, *actual])
        check_agreement(
            binding, f"the ONNX file {path.name}", actual, trial.expected, trial.sizes, fill
        )


__all__ = ["OPSET", "export_onnx", "measured_output_counts", "verify"]
