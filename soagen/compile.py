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
and checked against the eager model at several sizes, then moved into place.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import tempfile
import time
import traceback
import typing
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

import soagen
from soagen.dsl.loader import load
from soagen.dtypes import INTEGER_DTYPES
from soagen.errors import CommandError
from soagen.generator.python import generate
from soagen.runtime.aot import METADATA_FORMAT, METADATA_KEY, AotBackend, describe_binding
from soagen.runtime.collection import Collection
from soagen.runtime.model import ModelBinding
from soagen.runtime.spec import declared_index_bounds

Progress = Callable[[str], None]

# Example element count of the i-th input layout with alignment A: A * (16 + 2 i) + 1 (2049, 2305,
# ... for A = 128), large, different per layout, and off every alignment multiple.
_EXAMPLE_MULTIPLE = 16
# Small sizes the package is checked at after compiling, besides the example's.
_CHECK_SIZES = (1, 3, 37)

_STAGES = 6


class CompileError(CommandError):
    """`soagen compile` cannot go on; `usage` marks a wrong argument (exit 2) rather than a model
    that cannot be exported or compiled (exit 1)."""


def parse_index_bounds(items: Sequence[str]) -> dict[str, str]:
    """`["edge_index=node_features"]` -> `{"edge_index": "node_features"}`."""
    bounds: dict[str, str] = {}
    for item in items:
        index, sep, bound = item.partition("=")
        index, bound = index.strip(), bound.strip()
        if not sep or not index.isidentifier() or not bound.isidentifier():
            raise CompileError(
                f"--index takes INDEX=BOUND (input names, e.g. edge_index=node_features), got "
                f"{item!r}",
                usage=True,
            )
        if index in bounds and bounds[index] != bound:
            raise CompileError(f"--index gives {index!r} twice", usage=True)
        bounds[index] = bound
    return bounds


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
    no result tensors, no write-back copy (`soagen serve`, which has no output blocks, refuses such
    packages). Raises `SchemaError` for schema errors and
    `CompileError` for everything else. Prints nothing: `progress` receives one line per stage.
    """
    target = Path(output)
    if target.suffix != ".pt2":
        raise CompileError(f"the output must be a .pt2 file, got {str(target)!r}", usage=True)
    torch_device = _device(device)
    stages = _Stages(progress or (lambda line: None))
    with tempfile.TemporaryDirectory(prefix="soagen-compile-") as workdir:
        with stages.stage(f"loading schema {Path(schema_path).as_posix()}"):
            binding, layouts = _generated_binding(Path(schema_path), model_name, Path(workdir))
        try:
            _build_package(
                binding,
                layouts,
                factory,
                torch_device,
                index_bounds,
                _Variant(columnwise, write_outputs),
                target,
                stages,
            )
        finally:
            _forget_modules(binding)
    return target


@dataclass(frozen=True)
class _Variant:
    """How the package computes: `columnwise` rewrites narrow layers; `write_outputs` stores the
    results into the output blocks it is given."""

    columnwise: bool = False
    write_outputs: bool = False


def _build_package(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    factory: str,
    device: torch.device,
    index_bounds: Mapping[str, str] | None,
    variant: _Variant,
    target: Path,
    stages: _Stages,
) -> None:
    with stages.stage(f"building model ({factory})"):
        model, module = _build_model(factory, device)
        bounds = _index_bounds(binding, index_bounds, module)
        unbounded = unbounded_index_inputs(binding, bounds)
        if unbounded:
            stages.report(
                f"warning: integer input(s) {', '.join(unbounded)} have no index bound: if the "
                f"model indexes with them, a value out of range aborts the process inside the "
                f"package; declare `indexes NAME` in the schema (or pass --index)"
            )
        layers = _columnwise_layers(model, stages) if variant.columnwise else None
    reference = _SchemaOrder(model, binding)
    with stages.stage("exporting with dynamic element counts (torch.export)"):
        sizes = _example_sizes(binding, layouts)
        inputs = _example_inputs(binding, layouts, sizes, bounds, device, seed=0)
        results, written = _check_eager(binding, reference, inputs)
        wrapped: torch.nn.Module = reference
        if layers is not None:
            wrapped = _SchemaOrder(layers[0], binding)
            rewritten, _ = _run_on_copies(wrapped, inputs)
            _check_agreement(binding, "the columnwise model", rewritten, results, sizes)
        arguments = list(inputs)
        variable: list[bool] = []  # per output written: its element count follows an input's
        if variant.write_outputs:
            arguments += _example_outputs(binding, layouts, results, device)
            wrapped = _IntoOutputs(wrapped, len(inputs))
            # Every input layout's example count is its own (A * k + 1): an output of another
            # count is a fixed one (a total per event, say), exported as that number.
            variable = [
                result.shape[spec.block.axes.index("n")] in sizes.values()
                for spec, result in zip(binding.OUTPUTS, results, strict=True)
            ]
        exported = _export(binding, wrapped, arguments, variable)
        writes_inputs = _inputs_written(binding, exported, written)
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
        "columnwise": None if layers is None else layers[1],
        "writes_outputs": variant.write_outputs,
        "writes_inputs": writes_inputs,
        "input_geometry": _input_geometry(exported),
        "example_sizes": sizes,
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compiled next to the target and moved into place once checked: no half-written package.
    staging = target.with_name(f".{target.stem}.{uuid.uuid4().hex[:8]}.pt2")
    try:
        with stages.stage(f"compiling with AOTInductor for {device.type}"):
            _compile(exported, staging, metadata)
        with stages.stage("checking the package against the eager model"):
            _verify(binding, layouts, reference, staging, sizes, bounds, device)
        with stages.stage(f"packaging {target.as_posix()}"):
            os.replace(staging, target)
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


def _device(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise CompileError(f"--device {text!r} is not a torch device", usage=True) from None
    if device.type not in ("cpu", "cuda"):
        raise CompileError(
            f"AOTInductor packages are built for cpu or cuda, not {device.type}", usage=True
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CompileError(
            f"--device {text}: no CUDA device here; compile on a machine with the target GPU",
            usage=True,
        )
    return device


def _generated_binding(
    schema_path: Path, model_name: str, workdir: Path
) -> tuple[type[ModelBinding], dict[str, type[Collection]]]:
    """Generate the schema's modules into a throwaway package and import the model's class."""
    schema = load(schema_path).unwrap()
    files = {
        model.name: schema_file for schema_file in schema.files for model in schema_file.models
    }
    if model_name not in files:
        raise CompileError(schema.unknown_model(model_name, schema_path.as_posix()), usage=True)
    package = f"_soagen_compile_{uuid.uuid4().hex}"
    folder = workdir / package
    folder.mkdir()
    (folder / "__init__.py").write_text("", encoding="utf-8")
    for name, text in generate(schema).items():
        (folder / f"{name}.py").write_text(text, encoding="utf-8")
    sys.path.insert(0, str(workdir))
    try:
        importlib.invalidate_caches()
        modules = [importlib.import_module(f"{package}.{f.module_name}") for f in schema.files]
    finally:
        sys.path.remove(str(workdir))
    layouts: dict[str, type[Collection]] = {}
    for module in modules:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Collection)
                and value is not Collection
            ):
                layouts[value.NAME] = value
    module = modules[schema.files.index(files[model_name])]
    binding = getattr(module, model_name)
    return typing.cast(type[ModelBinding], binding), layouts


def _forget_modules(binding: type[ModelBinding]) -> None:
    package = binding.__module__.split(".", 1)[0]
    for name in [name for name in sys.modules if name.split(".", 1)[0] == package]:
        del sys.modules[name]


def _build_model(factory: str, device: torch.device) -> tuple[torch.nn.Module, ModuleType]:
    path_text, sep, function_name = factory.rpartition(":")
    if not sep or not path_text or not function_name.isidentifier():
        raise CompileError(
            f"--factory takes FILE.py:FUNCTION (e.g. examples/gnn_model.py:build_model), got "
            f"{factory!r}",
            usage=True,
        )
    path = Path(path_text)
    if not path.is_file():
        raise CompileError(f"factory file {path_text!r} does not exist", usage=True)
    name = f"_soagen_factory_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CompileError(f"{path_text} is not a Python file Python can import", usage=True)
    module = importlib.util.module_from_spec(spec)
    # As `python FILE.py` would: the file's folder is importable, for its sibling modules.
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    try:
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            raise CompileError(
                f"importing {path_text} failed{_raised_at(error, path)}: "
                f"{type(error).__name__}: {error}"
            ) from error
        function = getattr(module, function_name, None)
        if function is None or not callable(function):
            defined = sorted(
                key
                for key, value in vars(module).items()
                if inspect.isfunction(value) and value.__module__ == name
            )
            raise CompileError(
                f"{path_text} has no function {function_name!r}"
                + (f"; it defines {', '.join(defined)}" if defined else ""),
                usage=True,
            )
        try:
            model = function()
        except Exception as error:
            raise CompileError(
                f"{factory}() raised {type(error).__name__}{_raised_at(error, path)}: {error}"
            ) from error
    finally:
        sys.path.remove(str(path.resolve().parent))
        sys.modules.pop(name, None)
    if not isinstance(model, torch.nn.Module):
        raise CompileError(
            f"{factory}() returned {type(model).__name__}, not a torch.nn.Module", usage=True
        )
    return model.eval().to(device), module


def _raised_at(error: BaseException, path: Path) -> str:
    """` at FILE:LINE`: the last line of the factory file the error passed through, so that a
    failing factory is found without its traceback."""
    target = path.resolve()
    if isinstance(error, SyntaxError) and error.lineno is not None and error.filename:
        if Path(error.filename).resolve() == target:
            return f" at {path.as_posix()}:{error.lineno}"
    lines = [
        line
        for frame, line in traceback.walk_tb(error.__traceback__)
        if Path(frame.f_code.co_filename).resolve() == target
    ]
    return f" at {path.as_posix()}:{lines[-1]}" if lines else ""


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


def _index_bounds(
    binding: type[ModelBinding], given: Mapping[str, str] | None, module: ModuleType
) -> dict[str, str]:
    source = "--index"
    if given is None:
        given = getattr(module, "INDEX_BOUNDS", None) or {}
        source = "the factory module's INDEX_BOUNDS"
        if not isinstance(given, Mapping):
            raise CompileError(f"{source} must be a dict of input names", usage=True)
    inputs = {spec.name: spec for spec in binding.INPUTS}
    # The schema's `indexes` clauses first: --index or INDEX_BOUNDS add to them or replace them.
    bounds = declared_index_bounds(binding.INPUTS)
    for index_name, bound_name in given.items():
        for name in (index_name, bound_name):
            if name not in inputs:
                raise CompileError(
                    f"{source}: {binding.NAME} has no input {name!r}; its inputs are "
                    f"{', '.join(inputs)}",
                    usage=True,
                )
        dtype = inputs[index_name].block.dtype
        if dtype not in INTEGER_DTYPES:
            raise CompileError(
                f"{source}: input {index_name!r} holds {dtype}, not integer indices", usage=True
            )
        bounds[str(index_name)] = str(bound_name)
    return bounds


def _example_sizes(
    binding: type[ModelBinding], layouts: Mapping[str, type[Collection]]
) -> dict[str, int]:
    names = list(dict.fromkeys(spec.block.layout for spec in binding.INPUTS))
    return {
        name: layouts[name].ALIGNMENT * (_EXAMPLE_MULTIPLE + 2 * i) + 1
        for i, name in enumerate(names)
    }


def _example_inputs(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    sizes: Mapping[str, int],
    bounds: Mapping[str, str],
    device: torch.device,
    seed: int,
) -> list[torch.Tensor]:
    """Block views of freshly allocated collections, filled with valid data: indices in range of
    their bound, other integers 0 (they may index something the schema does not say), floats
    random."""
    generator = torch.Generator().manual_seed(seed)
    collections = {name: layouts[name].allocate(n, device, zero=True) for name, n in sizes.items()}
    specs = {spec.name: spec for spec in binding.INPUTS}
    views = []
    for spec in binding.INPUTS:
        view = collections[spec.block.layout].block(spec.block)
        views.append(view)
        # A scalar broadcast over n has stride 0: write its one value, not n of them.
        target = view
        for axis in reversed(range(view.dim())):
            if view.stride(axis) == 0 and view.shape[axis] > 0:
                target = target.select(axis, 0)
        if target.dtype.is_floating_point:
            values = torch.randn(target.shape, generator=generator)
        elif target.dtype == torch.bool:
            values = torch.randint(0, 2, target.shape, generator=generator).bool()
        elif spec.name in bounds:
            high = max(1, sizes[specs[bounds[spec.name]].block.layout])
            values = torch.randint(0, high, target.shape, generator=generator)
        else:
            continue
        target.copy_(values)
    return views


class _SchemaOrder(torch.nn.Module):
    """The model with its outputs as a tuple in the schema's order, whatever it returns."""

    def __init__(self, model: torch.nn.Module, binding: type[ModelBinding]) -> None:
        super().__init__()
        self.model = model
        self.output_names = [spec.name for spec in binding.OUTPUTS]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        result = self.model(*inputs)
        if isinstance(result, torch.Tensor):
            return (result,)
        if isinstance(result, Mapping):
            return tuple(result[name] for name in self.output_names)
        return tuple(result)


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


def _example_outputs(
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
        .allocate(n + layouts[name].ALIGNMENT * (4 * _EXAMPLE_MULTIPLE + 2 * i + 1), device)
        .slice(0, n)
        for i, (name, n) in enumerate(counts.items())
    }
    return [collections[spec.block.layout].block(spec.block) for spec in binding.OUTPUTS]


def _run_on_copies(
    model: torch.nn.Module, inputs: Sequence[torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], set[int]]:
    """The model's results on copies of `inputs` (a model that writes into its inputs must not
    change what the next run reads), and the positions of the copies it wrote into."""
    copies = [view.clone() for view in inputs]
    versions = [copy._version for copy in copies]
    with torch.no_grad():
        results: tuple[torch.Tensor, ...] = model(*copies)
    written = {i for i, copy in enumerate(copies) if copy._version != versions[i]}
    return results, written


def _inputs_written(
    binding: type[ModelBinding], exported: torch.export.ExportedProgram, seen: set[int]
) -> list[str]:
    """Names of the inputs the model writes into, in schema order: those the eager run was seen
    to write (`seen`) and those the exported graph mutates (on a path the example did not take,
    say). Output blocks a --write-outputs package fills are not among them."""
    # Export's first graph keeps in-place ops as they are; its functional form (what AOTInductor
    # compiles, ~0.3 s for the GNN example) lists each input it writes back into.
    try:
        with _torch_deprecations_ignored():
            signature = exported.run_decompositions({}).graph_signature
    except Exception as error:
        raise CompileError(
            f"torch.export cannot put the model for {binding.NAME} in functional form (to find "
            f"the inputs it writes): {_torch_error(error)}"
        ) from error
    positions = {str(name): i for i, name in enumerate(signature.user_inputs)}
    mutated = {positions[str(name)] for name in signature.user_inputs_to_mutate.values()}
    return [spec.name for i, spec in enumerate(binding.INPUTS) if i in seen or i in mutated]


def _check_eager(
    binding: type[ModelBinding], model: _SchemaOrder, inputs: Sequence[torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], set[int]]:
    """The model must run on the example and return what the output blocks hold: its results,
    and the positions of the inputs it writes into."""
    try:
        results, written = _run_on_copies(model, inputs)
    except Exception as error:
        raise CompileError(
            f"the model fails on example inputs of {binding.NAME} "
            f"({_describe_inputs(binding, inputs)}): {type(error).__name__}: {error}"
        ) from error
    if len(results) != len(binding.OUTPUTS) or not all(
        isinstance(r, torch.Tensor) for r in results
    ):
        raise CompileError(
            f"the model returns {len(results)} value(s); {binding.NAME} declares "
            f"{len(binding.OUTPUTS)} output tensor(s) "
            f"({', '.join(spec.name for spec in binding.OUTPUTS)})"
        )
    for spec, result in zip(binding.OUTPUTS, results, strict=True):
        block = spec.block
        if str(result.dtype).removeprefix("torch.") != block.dtype or result.dim() != len(
            block.axes
        ):
            raise CompileError(
                f"output {spec.name!r} is {result.dtype} {list(result.shape)}; the block "
                f"{block.layout}{{{', '.join(block.members)}}} holds {block.dtype} with axes "
                f"[{', '.join(block.axes)}]"
            )
    return results, written


def _describe_inputs(binding: type[ModelBinding], inputs: Sequence[torch.Tensor]) -> str:
    return ", ".join(
        f"{spec.name} {list(view.shape)} {str(view.dtype).removeprefix('torch.')}"
        for spec, view in zip(binding.INPUTS, inputs, strict=True)
    )


def _alias(view: torch.Tensor) -> torch.Tensor:
    """A tensor over the same memory with the same geometry that is not a view (see the module's
    docstring): export fakifies views through their base and would freeze their strides."""
    alias = torch.empty(0, dtype=view.dtype, device=view.device)
    return alias.set_(view.untyped_storage(), view.storage_offset(), view.shape, view.stride())


def _export(
    binding: type[ModelBinding],
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    variable_outputs: Sequence[bool] = (),
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
        with patch(use_duck_shape=False, backed_size_oblivious=True):
            return torch.export.export(model, arguments, dynamic_shapes=(tuple(dynamic),))
    except Exception as error:
        raise CompileError(
            f"torch.export cannot export the model for {binding.NAME} with dynamic element counts "
            f"({_describe_inputs(binding, inputs[: len(binding.INPUTS)])}): {_torch_error(error)}"
        ) from error


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
    exported: torch.export.ExportedProgram, path: Path, metadata: Mapping[str, object]
) -> None:
    from torch._inductor import aoti_compile_and_package

    try:
        with _torch_deprecations_ignored():
            aoti_compile_and_package(
                exported,
                package_path=str(path),
                inductor_configs={"aot_inductor.metadata": {METADATA_KEY: json.dumps(metadata)}},
            )
    except Exception as error:
        raise CompileError(
            f"AOTInductor cannot compile the model: {_torch_error(error)}"
        ) from error


def _torch_error(error: Exception) -> str:
    """An error torch raised, as a CompileError quotes it: its type and first six lines (torch's
    messages go on with long guides and graph dumps)."""
    first = str(error).strip().splitlines()[:6]
    return f"{type(error).__name__}: " + "\n".join(first)


def _verify(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    model: _SchemaOrder,
    package: Path,
    example_sizes: Mapping[str, int],
    bounds: Mapping[str, str],
    device: torch.device,
) -> None:
    """Load the package as users will and compare it with the eager model at several sizes,
    different per layout, which catches a size or stride the export fixed by mistake."""
    backend = AotBackend(package, binding)
    runner = backend.on(device)
    trials = [dict(example_sizes)]
    for base in _CHECK_SIZES:
        trials.append({name: base + 5 * i for i, name in enumerate(example_sizes)})
    for seed, sizes in enumerate(trials, start=1):
        inputs = _example_inputs(binding, layouts, sizes, bounds, device, seed=seed)
        try:
            expected, _ = _run_on_copies(model, inputs)
        except Exception:
            continue  # the eager model itself does not take these sizes (n = 1, say)
        if backend.writes_outputs:
            actual = _example_outputs(binding, layouts, expected, device)
            for view in actual:
                view.fill_(-7)  # so that an output the package does not write shows
            with torch.inference_mode():
                runner([*inputs, *actual])
        else:
            with torch.inference_mode():
                actual = typing.cast(list[torch.Tensor], runner(inputs))
        _check_agreement(binding, "the compiled package", actual, expected, sizes)


def _check_agreement(
    binding: type[ModelBinding],
    what: str,
    actual: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    sizes: Mapping[str, int],
) -> None:
    """`what`'s outputs must agree with the eager model's, run on inputs of `sizes`."""
    for spec, got, want in zip(binding.OUTPUTS, actual, expected, strict=True):
        try:
            _assert_close(got, want)
        except AssertionError as error:
            shown = ", ".join(f"{name} n={n}" for name, n in sizes.items())
            raise CompileError(
                f"{what} disagrees with the eager model on output {spec.name!r} for {shown}: "
                f"{error}"
            ) from None


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if expected.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(actual, expected, rtol=1e-2, atol=1e-2)
    elif expected.is_floating_point():
        torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4)
    else:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


__all__ = ["CompileError", "compile_model", "parse_index_bounds"]
