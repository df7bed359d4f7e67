"""`soagen compile`: export a model for one of a schema's bindings and compile it with AOTInductor.

The package runs on collections' block views as they are, for any element count, with no copy:

- Example inputs are real collections' block views (one collection per input layout), passed to
  `torch.export` as plain tensors over the same memory (`Tensor.set_`: same storage, sizes, strides
  and offset). Export fakifies a *view* through its `_base` and keeps its strides as constants, so
  a view would tie the package to the example's pitch.
- Each block's element axis is `Dim.DYNAMIC`, which also makes every stride that is not a product
  of sizes a symbol of its own that the compiled code reads from the input tensor at run time (with
  named `Dim`s, torch 2.13 keeps strides static). So the pitch, `round_up(n * itemsize, A) /
  itemsize`, needs no formula in the graph, and slices of collections (the parent's pitch with
  fewer elements) run too.
- Duck shaping is off during export: a pitch that happens to equal another size or pitch in the
  example must not become the same symbol. Each layout's example element count is `A * k + 1`,
  whose pitches differ from n whenever they can (itemsize below the alignment A).
- `backed_size_oblivious` lets the element counts range over 0 and 1 instead of specializing them,
  so n = 1 runs; n = 0 never reaches the model (the runtime skips empty outputs).
- With `write_outputs`, the exported `forward(*inputs, *outputs)` copies each result into its output
  block view (example views sliced from larger collections, so their pitches are their own); export
  keeps the mutation, and Inductor stores the last values straight into the output columns.

The package records soagen's metadata (`soagen.runtime.aot`), is loaded once more after compiling
(a GPU package first in a process of its own, where a loader that crashes ends only that process)
and checked against the eager model at several sizes, then moved into place.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import typing
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import soagen
from soagen.build.errors import CommandError
from soagen.build.model import (
    EXAMPLE_MULTIPLE,
    ExampleFill,
    SchemaOrder,
    build_model,
    check_agreement,
    check_eager,
    check_finite,
    describe_inputs,
    eager_trials,
    example_inputs,
    example_sizes,
    forget_generated_modules,
    generated_binding,
    load_examples,
    resolve_index_bounds,
    run_on_copies,
    torch_device,
)
from soagen.dsl.dtypes import INTEGER_DTYPES
from soagen.runtime.aot import (
    METADATA_FORMAT,
    METADATA_KEY,
    PACKAGE_MODEL,
    AotBackend,
    describe_binding,
    instruction_sets,
)
from soagen.runtime.collection import Collection
from soagen.runtime.model import ModelBinding, index_message

Progress = Callable[[str], None]

_STAGES = 6


class CompileError(CommandError):
    """`soagen compile` cannot go on; `usage` marks a wrong argument (exit 2) rather than a model
    that cannot be exported or compiled (exit 1)."""


def compile_model(
    schema_path: str | os.PathLike[str],
    model_name: str,
    factory: str,
    *,
    output: str | os.PathLike[str],
    device: str = "cpu",
    index_bounds: Mapping[str, str] | None = None,
    columnwise: bool = False,
    write_outputs: bool = False,
    examples: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Build `factory()` ("path/to/file.py:function"), export it for binding `model_name` of the
    schema, compile it with AOTInductor for `device` and write the package to `output` (`.pt2`).

    `index_bounds` maps an integer input to the input whose elements it indexes; by default the
    factory module's `INDEX_BOUNDS`, if it has one. `columnwise` computes the model's narrow
    `nn.Linear` layers column by column across elements (`soagen.runtime.columnwise`), so that
    Inductor fuses them into one loop; the package is still checked against the model as written.
    `write_outputs` exports `forward(*inputs, *outputs)` copying each result into its output
    block inside the graph, so Inductor stores the last values straight into the output columns:
    no result tensors, no write-back copy (a server allocates the output blocks per event, sized as
    the package records). `examples` ("path/to/file.py:function") fills the example collections the model
    is exported and checked on with realistic values (`soagen.build.model.ExampleFill`). Raises
    `SchemaError` for schema errors and `CommandError` for everything else: a
    `CompileError`, or the `soagen.build.model` helpers' own (a factory that fails, say). Prints
    nothing: `progress` receives one line per stage.
    """
    target = Path(output)
    if target.suffix != ".pt2":
        raise CompileError(f"the output must be a .pt2 file, got {str(target)!r}", usage=True)
    # Found now, not after a compile of tens of seconds.
    if target.is_dir():
        raise CompileError(f"--output {target}: a folder of that name exists", usage=True)
    blocking = next((parent for parent in target.parents if parent.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise CompileError(f"--output {target}: {blocking} is a file, not a folder", usage=True)
    target_device = torch_device(device)
    fill = None if examples is None else load_examples(examples)
    stages = _Stages(progress or (lambda line: None))
    with tempfile.TemporaryDirectory(prefix="soagen-compile-") as workdir:
        with stages.stage(f"loading schema {Path(schema_path).as_posix()}"):
            binding, layouts = generated_binding(Path(schema_path), model_name, Path(workdir))
        try:
            _build_package(
                binding,
                layouts,
                factory,
                target_device,
                index_bounds,
                _Variant(columnwise, write_outputs),
                target,
                stages,
                fill,
            )
        finally:
            forget_generated_modules(binding)
    return target


@dataclass(frozen=True)
class _Variant:
    """How the package computes: `columnwise` rewrites narrow layers; `write_outputs` stores the
    results into the output blocks it is given."""

    columnwise: bool
    write_outputs: bool


def _build_package(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    factory: str,
    device: torch.device,
    index_bounds: Mapping[str, str] | None,
    variant: _Variant,
    target: Path,
    stages: _Stages,
    fill: ExampleFill | None,
) -> None:
    log = _TorchLog(target.with_name(f"{target.stem}.compile.log"))
    log.path.unlink(missing_ok=True)  # an earlier run's, which would no longer be true
    with stages.stage(f"building model ({factory})"):
        model, module = build_model(factory, device)
        bounds = resolve_index_bounds(binding, index_bounds, module)
        unbounded = unbounded_index_inputs(binding, bounds)
        if unbounded:
            stages.report(
                f"warning: integer input(s) {', '.join(unbounded)} have no index bound: if the "
                f"model indexes with them, a value out of range aborts the process inside the "
                f"package; declare `indexes NAME` in the schema (or pass --index)"
            )
        layers = _columnwise_layers(model, stages) if variant.columnwise else None
    reference = SchemaOrder(model, binding)
    with stages.stage("exporting with dynamic element counts (torch.export)"):
        sizes = example_sizes(binding, layouts)
        inputs = example_inputs(binding, layouts, sizes, bounds, device, seed=0, fill=fill)
        results, written = check_eager(binding, reference, inputs)
        check_finite(binding, results, sizes, fill)
        wrapped: torch.nn.Module = reference
        if layers is not None:
            wrapped = SchemaOrder(layers[0], binding)
            rewritten, _ = run_on_copies(wrapped, inputs)
            check_agreement(binding, "the columnwise model", rewritten, results, sizes, fill)
        checked = index_checks_in_package(binding, bounds, device)
        if checked:
            wrapped = _IndexRangeChecks(wrapped, binding, checked)
        arguments = list(inputs)
        variable: list[bool] = []  # per output written: its element count follows an input's
        if variant.write_outputs:
            arguments += example_outputs(binding, layouts, results, device)
            wrapped = _IntoOutputs(wrapped, len(inputs))
            # Every input layout's example count is its own (A * k + 1): an output of another
            # count is a fixed one (a total per event, say), exported as that number.
            variable = [
                result.shape[spec.block.axes.index("n")] in sizes.values()
                for spec, result in zip(binding.OUTPUTS, results, strict=True)
            ]
        exported = _export(binding, wrapped, arguments, variable, log)
        writes_inputs = _inputs_written(binding, exported, written, log)
        if writes_inputs:
            stages.report(
                f"the model writes into its input(s) {', '.join(writes_inputs)}: the package "
                f"runs only when loaded with protect_inputs=True (on copies of the collections)"
            )
    metadata = {
        "format": METADATA_FORMAT,
        "soagen_version": soagen.__version__,
        "torch_version": torch.__version__,
        "device": device.type,
        "schema": binding.SCHEMA,
        "factory": factory,
        "binding": describe_binding(binding),
        "index_bounds": bounds,
        "index_ranges_checked": checked,
        "columnwise": None if layers is None else layers[1],
        "writes_outputs": variant.write_outputs,
        "writes_inputs": writes_inputs,
        "input_geometry": _input_geometry(exported),
        "example_sizes": sizes,
        "cpu_flags": native_instruction_sets(),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compiled next to the target and moved into place once checked: no half-written package.
    staging = target.with_name(f".{target.stem}.{uuid.uuid4().hex[:8]}.pt2")
    try:
        with stages.stage(f"compiling with AOTInductor for {device.type}"):
            _compile(exported, staging, metadata, log)
        with stages.stage("checking the package against the eager model"):
            if device.type not in _IN_PROCESS_LOADS:
                failed = loads_in_a_fresh_process(staging, device)
                if failed is not None:
                    stages.report(f"loading it in a process of its own failed ({failed})")
            _verify(binding, layouts, reference, staging, sizes, bounds, device, fill)
            if checked:
                verify_index_checks(
                    binding,
                    AotBackend(staging, binding).on(device),
                    example_inputs(binding, layouts, sizes, bounds, device, seed=0, fill=fill),
                    example_outputs(binding, layouts, results, device)
                    if variant.write_outputs
                    else None,
                    checked,
                )
        with stages.stage(f"packaging {target.as_posix()}"):
            os.replace(staging, target)
        lines = log.text.getvalue().count("\n")
        if lines:
            log.write()
            stages.report(f"torch logged {lines} lines while building: {log.path.as_posix()}")
    finally:
        staging.unlink(missing_ok=True)


class _Stages:
    def __init__(self, report: Progress) -> None:
        self.report = report
        self.count = 0

    @contextlib.contextmanager
    def stage(self, title: str) -> Iterator[None]:
        self.count += 1
        label = f"[{self.count}/{_STAGES}] {title}"
        self.report(f"{label} ...")
        start = time.perf_counter()
        yield
        self.report(f"{label}: done in {time.perf_counter() - start:.1f} s")


def _columnwise_layers(
    model: torch.nn.Module, stages: _Stages
) -> tuple[torch.nn.Module, list[str]]:
    from soagen.runtime.columnwise import MAX_FUSED_OUTPUTS, columnwise, max_unrolled_inputs

    try:
        rewritten, names = columnwise(model)
    except TypeError as error:
        raise CompileError(f"--columnwise: {error}", usage=True) from None
    linear = sum(type(module) is torch.nn.Linear for module in model.modules())
    if names:
        stages.report(f"columnwise: {', '.join(names)} ({len(names)} of {linear} nn.Linear layers)")
    else:
        stages.report(
            f"columnwise: none of its {linear} nn.Linear layers is narrow enough (at most "
            f"{max_unrolled_inputs()} inputs or {MAX_FUSED_OUTPUTS} outputs); compiled as written"
        )
    return rewritten, names


def unbounded_index_inputs(binding: type[ModelBinding], bounds: Mapping[str, str]) -> list[str]:
    """Integer inputs no bound covers: compiled kernels index with their values unchecked."""
    return [
        spec.name
        for spec in binding.INPUTS
        if spec.block.dtype in INTEGER_DTYPES and spec.name not in bounds
    ]


# Index dtypes whose range the package checks itself: the comparisons export and Inductor's C++
# take for every one of them (torch's unsigned types past uint8 have few operators).
_CHECKED_IN_PACKAGE = frozenset({"int8", "int16", "int32", "int64", "uint8"})


def index_checks_in_package(
    binding: type[ModelBinding], bounds: Mapping[str, str], device: torch.device
) -> dict[str, str]:
    """The index inputs (with the input each indexes) whose range a package for `device` checks
    itself, so that a binding's repeated calls leave the check to it: on CPU, where a failed check
    raises from the package. On a GPU it would be a device-side assert that a Triton kernel built
    without debug drops, so the binding's own kernel checks there."""
    if device.type != "cpu":
        return {}
    dtypes = {spec.name: spec.block.dtype for spec in binding.INPUTS}
    return {
        index_name: bound_name
        for index_name, bound_name in bounds.items()
        if dtypes[index_name] in _CHECKED_IN_PACKAGE
    }


class _IndexRangeChecks(torch.nn.Module):
    """The model behind a range check of its index inputs, in the graph: every value of each
    must lie in [0, n), n the element count of the input it indexes, or the package raises with
    the binding's message before the model runs."""

    def __init__(
        self, model: torch.nn.Module, binding: type[ModelBinding], checked: Mapping[str, str]
    ) -> None:
        super().__init__()
        self.model = model
        position = {spec.name: i for i, spec in enumerate(binding.INPUTS)}
        self.checks = [
            (
                position[index_name],
                position[bound_name],
                binding.INPUTS[position[bound_name]].block.axes.index("n"),
                index_message(binding, index_name, bound_name, None),
            )
            for index_name, bound_name in checked.items()
        ]

    def forward(self, *inputs: torch.Tensor) -> typing.Any:
        for index_position, bound_position, axis, message in self.checks:
            indices, bound = inputs[index_position], inputs[bound_position].shape[axis]
            torch._assert_async(((indices >= 0) & (indices < bound)).all(), message)
        return self.model(*inputs)


def verify_index_checks(
    binding: type[ModelBinding],
    runner: typing.Callable[[Sequence[torch.Tensor]], object],
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor] | None,
    checked: Mapping[str, str],
) -> None:
    """The package must refuse each checked index input holding a value outside its range (n of
    the input it indexes, and -1 where the dtype is signed), at its first and at its last
    element, and write nothing into its output blocks (`outputs`, where it writes them) first: a
    binding leaves those checks to it. Each value is put back after its trial."""
    position = {spec.name: i for i, spec in enumerate(binding.INPUTS)}
    for view in outputs or ():
        view.fill_(-7)
    arguments = [*inputs, *(outputs or ())]
    for index_name, bound_name in checked.items():
        indices = inputs[position[index_name]]
        bound_spec = binding.INPUTS[position[bound_name]]
        bound = inputs[position[bound_name]].shape[bound_spec.block.axes.index("n")]
        limits = torch.iinfo(indices.dtype)
        # n itself where the dtype holds it (in uint8, every value lies below n > 255).
        values = [value for value in (bound, -1) if limits.min <= value <= limits.max]
        corners = sorted({(0,) * indices.dim(), tuple(size - 1 for size in indices.shape)})
        for corner, value in itertools.product(corners, values):
            kept = indices[corner].item()
            indices[corner] = value
            try:
                with torch.inference_mode(), _native_stderr_discarded():
                    runner(arguments)
                refused = False
            except RuntimeError:
                refused = True
            finally:
                indices[corner] = kept
            trial = (
                f"input {index_name!r} holding {value} at {list(corner)} ({bound_name!r} holds "
                f"{bound} elements)"
            )
            if not refused:
                raise CompileError(
                    f"the compiled package for {binding.NAME} ran with {trial}: the index range "
                    f"check compiled into it did not fire, so it was not written"
                )
            if any(bool((view != -7).any()) for view in outputs or ()):
                raise CompileError(
                    f"the compiled package for {binding.NAME} wrote into its output blocks "
                    f"before the index range check compiled into it refused {trial}, so it was "
                    f"not written"
                )


@contextlib.contextmanager
def _native_stderr_discarded() -> Iterator[None]:
    """The package's C++ runner prints each error it raises to the process's stderr, besides
    raising it: the range check's trials expect theirs."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _IntoOutputs(torch.nn.Module):
    """`forward(*inputs, *outputs)`: the model's results copied into the output views, in the
    graph (torch.export keeps the mutation; Inductor stores into the views' memory)."""

    def __init__(self, model: torch.nn.Module, input_count: int) -> None:
        super().__init__()
        self.model = model
        self.input_count = input_count

    def forward(self, *views: torch.Tensor) -> tuple[()]:
        results = self.model(*views[: self.input_count])
        for view, result in zip(views[self.input_count :], results, strict=True):
            # Equal sizes, not broadcast: export then ties each output axis to what computes it
            # (an input's element count, or a constant such as 1), which the runtime checks.
            for axis in range(result.dim()):
                torch._check(view.shape[axis] == result.shape[axis])  # type: ignore[no-untyped-call]
            view.copy_(result)
        return ()


def example_outputs(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    results: Sequence[torch.Tensor],
    device: torch.device,
) -> list[torch.Tensor]:
    """Output block views for `results` (the eager model's on the example inputs), in slices of
    larger collections: their pitches differ from every input's and from each other's, so that
    export gives each pitch a stride symbol of its own (see the module's docstring)."""
    counts: dict[str, int] = {}
    for spec, result in zip(binding.OUTPUTS, results, strict=True):
        counts.setdefault(spec.block.layout, result.shape[spec.block.axes.index("n")])
    collections = {
        name: layouts[name]
        .allocate(n + layouts[name].ALIGNMENT * (4 * EXAMPLE_MULTIPLE + 2 * i + 1), device)
        .slice(0, n)
        for i, (name, n) in enumerate(counts.items())
    }
    return [collections[spec.block.layout].block(spec.block) for spec in binding.OUTPUTS]


def _inputs_written(
    binding: type[ModelBinding],
    exported: torch.export.ExportedProgram,
    seen: set[int],
    log: _TorchLog,
) -> list[str]:
    """Names of the inputs the model writes into, in schema order: those the eager run was seen
    to write (`seen`) and those the exported graph mutates (on a path the example did not take,
    say). Output blocks a --write-outputs package fills are not among them."""
    # Export's first graph keeps in-place ops as they are; its functional form (what AOTInductor
    # compiles, ~0.3 s for the GNN example) lists each input it writes back into.
    try:
        with _torch_deprecations_ignored(), log.held():
            signature = exported.run_decompositions({}).graph_signature
    except Exception as error:
        raise CompileError(
            f"torch.export cannot put the model for {binding.NAME} in functional form (to find "
            f"the inputs it writes):\n{log.failure(error)}"
        ) from error
    positions = {str(name): i for i, name in enumerate(signature.user_inputs)}
    mutated = {positions[str(name)] for name in signature.user_inputs_to_mutate.values()}
    return [spec.name for i, spec in enumerate(binding.INPUTS) if i in seen or i in mutated]


def _alias(view: torch.Tensor) -> torch.Tensor:
    """A tensor over the same memory with the same geometry that is not a view (see the module's
    docstring): export fakifies views through their base and would freeze their strides."""
    alias = torch.empty(0, dtype=view.dtype, device=view.device)
    return alias.set_(view.untyped_storage(), view.storage_offset(), view.shape, view.stride())


def _export(
    binding: type[ModelBinding],
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    variable_outputs: Sequence[bool],
    log: _TorchLog,
) -> torch.export.ExportedProgram:
    """Export with the element axis dynamic in every input; `inputs` may end with output blocks
    (`_IntoOutputs`), whose element axis is dynamic where `variable_outputs` says so."""
    import torch.fx.experimental._config as fx_config
    from torch.export import Dim

    dynamic: list[dict[int, typing.Any]] = []
    variable = [True] * len(binding.INPUTS) + list(variable_outputs)
    specs = (*binding.INPUTS, *binding.OUTPUTS)[: len(variable)]
    for spec, free in zip(specs, variable, strict=True):
        axes = spec.block.axes
        dynamic.append({axes.index("n"): Dim.DYNAMIC} if "n" in axes and free else {})
    arguments = tuple(_alias(view) for view in inputs)
    try:
        # `patch` is added to config modules at import time, so the type checker cannot see it.
        patch = typing.cast(typing.Any, fx_config).patch
        with patch(use_duck_shape=False, backed_size_oblivious=True), log.held():
            return torch.export.export(model, arguments, dynamic_shapes=(tuple(dynamic),))
    except Exception as error:
        raise CompileError(
            f"torch.export cannot export the model for {binding.NAME} with dynamic element counts "
            f"({describe_inputs(binding, inputs[: len(binding.INPUTS)])}):\n{log.failure(error)}"
        ) from error


def native_instruction_sets() -> list[str] | None:
    """This CPU's instruction-set extensions where AOTInductor builds the package's C++ (a CUDA
    package's host code too) with `-march=native`, its default; None where
    `TORCHINDUCTOR_CPP_MARCH` (`config.cpp.march`) names a target, which the builder then chose."""
    from torch._inductor import config

    if getattr(config.cpp, "march", None) is not None:
        return None
    return instruction_sets()


def _input_geometry(exported: torch.export.ExportedProgram) -> list[dict[str, list[str]]]:
    """Each input's sizes and strides as the exported program sees them (symbols or numbers)."""
    nodes = {node.name: node for node in exported.graph.nodes if node.op == "placeholder"}
    geometry = []
    for name in exported.graph_signature.user_inputs:
        value = nodes[str(name)].meta["val"]
        geometry.append(
            {
                "sizes": [str(size) for size in value.shape],
                "strides": [str(stride) for stride in value.stride()],
            }
        )
    return geometry


@contextlib.contextmanager
def _torch_deprecations_ignored() -> Iterator[None]:
    """torch 2.13's own export and packaging code trips its pytree deprecation: nothing to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        yield


def _compile(
    exported: torch.export.ExportedProgram,
    path: Path,
    metadata: Mapping[str, object],
    log: _TorchLog,
) -> None:
    from torch._inductor import aoti_compile_and_package

    try:
        with _torch_deprecations_ignored(), log.held():
            aoti_compile_and_package(
                exported,
                package_path=str(path),
                inductor_configs={"aot_inductor.metadata": {METADATA_KEY: json.dumps(metadata)}},
            )
    except Exception as error:
        raise CompileError(
            f"AOTInductor cannot compile the model:\n{log.failure(error)}"
        ) from error


class _TorchLog:
    """What torch prints and logs while it exports and compiles (graph dumps of hundreds of
    lines), held and written to one log file beside the package instead of the terminal; and
    torch's errors, told short: the frame of the user's model code, torch's first line and its
    hints, then the log's path for the rest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = io.StringIO()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        handlers = [
            handler
            for name, logger in list(logging.Logger.manager.loggerDict.items())
            if name == "torch" or name.startswith("torch.")
            if isinstance(logger, logging.Logger)
            for handler in logger.handlers
            if isinstance(handler, logging.StreamHandler)
            and handler.stream in (sys.stderr, sys.__stderr__, sys.stdout, sys.__stdout__)
        ]
        streams = [handler.setStream(self.text) for handler in handlers]
        try:
            with contextlib.redirect_stderr(self.text):
                yield
        finally:
            for handler, stream in zip(handlers, streams, strict=True):
                handler.setStream(stream)

    def failure(self, error: BaseException) -> str:
        """`error` in a few lines, naming the log file, which receives everything."""
        full = "".join(traceback.format_exception(error))
        self.write(full)
        lines = str(error).strip().splitlines() or [""]
        hints = [
            line.strip() for line in lines[1:] if line.strip().lower().startswith(_HINT_STARTS)
        ][:3]
        frames = _user_frames(error)
        return "\n".join(
            [
                *(f"  at {frame}" for frame in frames),
                f"  {type(error).__name__}: {lines[0]}",
                *(f"  hint: {hint}" for hint in hints),
                f"  the full text is in {self.path.as_posix()}",
            ]
        )

    def write(self, extra: str = "") -> None:
        held = self.text.getvalue()
        if not held and not extra:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(held + ("\n" if held and extra else "") + extra, encoding="utf-8")


# How torch's errors start the lines that say what to do.
_HINT_STARTS = ("consider", "hint", "suggested fix", "you can", "try ", "to fix", "please ")


def _user_frames(error: BaseException) -> list[str]:
    """`file:line in function: source` of the innermost frames of `error` outside torch, soagen
    and Python's own library: where the user's model code failed (its last two)."""
    frames = []
    for frame in traceback.extract_tb(error.__traceback__):
        if not frame.filename.startswith("<") and _is_users(Path(frame.filename)):
            source = f": {frame.line.strip()}" if frame.line else ""
            frames.append(f"{frame.filename}:{frame.lineno} in {frame.name}{source}")
    return frames[-2:]


def _is_users(path: Path) -> bool:
    """Whether `path` is neither torch's nor soagen's code nor Python's own library (whose
    folder may hold site-packages, where installed model code such as weaver-core's lies)."""
    if any(path.is_relative_to(Path(str(m.__file__)).parent) for m in (torch, soagen)):
        return False
    paths = sysconfig.get_paths()
    if any(path.is_relative_to(paths[key]) for key in ("purelib", "platlib")):
        return True
    return not path.is_relative_to(paths["stdlib"])


# What a fresh interpreter runs to load a package as `AotBackend` does: path, device index.
# Loading takes seconds; a loader that hangs is stopped after this long.
_CHILD_LOAD_S = 600
_LOAD_IN_CHILD = (
    "import sys, torch; "
    "torch._C._aoti.AOTIModelPackageLoader(sys.argv[1], sys.argv[2], False, 1, int(sys.argv[3]))"
)
# Devices whose packages are loaded in this process straight away: torch's CPU loader has never
# crashed one, and a child's start would add seconds to every CPU compile.
_IN_PROCESS_LOADS = frozenset({"cpu"})
# Signals that stop a process from outside (the user, the out-of-memory killer): not a crash.
_STOPPED_BY = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"})


def loads_in_a_fresh_process(package: Path, device: torch.device) -> str | None:
    """Load `package` on `device` in a child interpreter first. torch's loader can crash the
    process instead of raising (torch 2.11's on CUDA, `benchmarks/RESULTS.md`): a crash, a signal
    or a hang is a `CompileError`, not the end of `soagen compile`. A child that exits with an
    error (a GPU that takes one process at a time, say) proves nothing either way: its last line
    is returned, and the check in this process follows. None: loaded."""
    index = -1
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.empty_cache()  # what this process holds but no longer uses, for the child
    command = [sys.executable, "-c", _LOAD_IN_CHILD, str(package), PACKAGE_MODEL, str(index)]
    torch_build = f"torch {torch.__version__}"
    # The loader unpacks the package into a folder of TMPDIR, which a process that dies leaves.
    with tempfile.TemporaryDirectory(prefix="soagen-load-") as unpacked:
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=_CHILD_LOAD_S,
                env={**os.environ, "TMPDIR": unpacked},
            )
        except subprocess.TimeoutExpired:
            raise CompileError(
                f"{torch_build}'s AOTInductor loader did not load the package it had just "
                f"compiled for {device} within {_CHILD_LOAD_S} s, in a process of its own; the "
                f"package was not written"
            ) from None
        except OSError as error:
            raise CompileError(
                f"cannot start a process to load the package in ({error}); the package was not "
                f"written"
            ) from None
    if done.returncode == 0:
        return None
    said = done.stderr.strip().splitlines()
    if done.returncode > 0:
        return said[-1] if said else f"exit status {done.returncode}"
    try:
        name = signal.Signals(-done.returncode).name
    except ValueError:
        name = f"signal {-done.returncode}"
    last = "".join(f"\n  {line}" for line in said[-5:])
    if name in _STOPPED_BY:
        raise CompileError(
            f"the process loading the package just compiled for {device} was stopped ({name}); "
            f"the package was not written{last}"
        )
    raise CompileError(
        f"{torch_build}'s AOTInductor loader crashed ({name}) loading the package it had just "
        f"compiled for {device}, in a process of its own: loading it here would have ended "
        f"soagen compile the same way, so the package was not written. Try another torch "
        f"version, or --device cpu{last}"
    )


def _verify(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    model: SchemaOrder,
    package: Path,
    example: Mapping[str, int],
    bounds: Mapping[str, str],
    device: torch.device,
    fill: ExampleFill | None,
) -> None:
    """Load the package as users will and compare it with the eager model at several sizes,
    different per layout, which catches a size or stride the export fixed by mistake."""
    backend = AotBackend(package, binding)
    runner = backend.on(device)
    for trial in eager_trials(binding, layouts, model, example, bounds, device, fill):
        if backend.writes_outputs:
            actual = example_outputs(binding, layouts, trial.expected, device)
            for view in actual:
                view.fill_(-7)  # so that an output the package does not write shows
            with torch.inference_mode():
                runner([*trial.inputs, *actual])
        else:
            with torch.inference_mode():
                actual = typing.cast(list[torch.Tensor], runner(trial.inputs))
        check_agreement(binding, "the compiled package", actual, trial.expected, trial.sizes, fill)


__all__ = ["CompileError", "compile_model"]
