"""Building a model for one of a schema's bindings, and checking it on example collections: what
`soagen compile`, `soagen triton` and `soagen serve` share.

- `generated_binding` generates a schema's modules into a throwaway package and imports a binding
  class and the layout classes (`layout_classes`); `forget_generated_modules` drops that package
  again.
- `build_model` calls a factory ("file.py:function") for its `nn.Module`, on `torch_device`;
  `resolve_index_bounds` merges the schema's `indexes` clauses with --index or `INDEX_BOUNDS`.
- `example_sizes` and `example_inputs` make block views of real collections, filled with valid
  data, at the example's element counts or at those of `trial_sizes`; `SchemaOrder` wraps the
  model to return its outputs as a tuple in schema order; `check_eager` runs it on them and
  `check_agreement` compares another form of the model (a package, a TorchScript module) with it.

Errors are `CommandError`s (usage errors flagged), as each command reports them. Imports torch.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
import traceback
import typing
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from soagen.build.errors import CommandError
from soagen.dsl.dtypes import INTEGER_DTYPES
from soagen.dsl.loader import load
from soagen.generator.python import generate
from soagen.runtime.agreement import first_disagreement, nonfinite_outputs
from soagen.runtime.buffers import contiguous_copy
from soagen.runtime.collection import Collection
from soagen.runtime.errors import OutputError
from soagen.runtime.model import ModelBinding, outputs_in_schema_order, same_n_groups
from soagen.runtime.spec import declared_index_bounds

# Example element count of the i-th input layout with alignment A: A * (16 + 2 i) + 1 (2049, 2305,
# ... for A = 128), large, different per layout, and off every alignment multiple.
EXAMPLE_MULTIPLE = 16
# Small element counts a compiled or converted model is checked at, besides the example's.
CHECK_BASES = (1, 3, 37)


def torch_device(text: str) -> torch.device:
    """The torch device `text` names (--device): cpu, or cuda where a GPU is."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise CommandError(f"--device {text!r} is not a torch device", usage=True) from None
    if device.type not in ("cpu", "cuda"):
        raise CommandError(
            f"--device {text}: soagen builds and runs models on cpu or cuda, not {device.type}",
            usage=True,
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandError(
            f"--device {text}: this machine has no CUDA device (torch {torch.__version__}); run "
            f"this where the target GPU is",
            usage=True,
        )
    return device


def generated_binding(
    schema_path: Path, model_name: str, workdir: Path
) -> tuple[type[ModelBinding], dict[str, type[Collection]]]:
    """Generate the schema's modules into a throwaway package and import the model's class."""
    schema = load(schema_path).unwrap()
    files = {
        model.name: schema_file for schema_file in schema.files for model in schema_file.models
    }
    if model_name not in files:
        raise CommandError(schema.unknown_model(model_name, schema_path.as_posix()), usage=True)
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
    module = modules[schema.files.index(files[model_name])]
    binding = getattr(module, model_name)
    return typing.cast(type[ModelBinding], binding), layout_classes(*modules)


def layout_classes(*modules: ModuleType) -> dict[str, type[Collection]]:
    """Layout name -> class, for the layout classes the generated `modules` define or import."""
    return {
        value.NAME: value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, Collection) and value is not Collection
    }


def forget_generated_modules(binding: type[ModelBinding]) -> None:
    """Drop the throwaway package of `generated_binding` from `sys.modules`."""
    package = binding.__module__.split(".", 1)[0]
    for name in [name for name in sys.modules if name.split(".", 1)[0] == package]:
        del sys.modules[name]


def build_model(factory: str, device: torch.device) -> tuple[torch.nn.Module, ModuleType]:
    """The `nn.Module` that `factory` ("file.py:function") returns, in eval mode on `device`, and
    the factory's module."""
    with _imported_function(factory, "--factory", "e.g. examples/gnn_model.py:build_model") as (
        function,
        module,
        path,
    ):
        try:
            model = function()
        except Exception as error:
            raise CommandError(
                f"{factory}() raised {type(error).__name__}{_raised_at(error, path)}: {error}"
            ) from error
    if not isinstance(model, torch.nn.Module):
        raise CommandError(
            f"{factory}() returned {type(model).__name__}, not a torch.nn.Module", usage=True
        )
    return model.eval().to(device), module


class ExampleFill:
    """--examples FILE.py:FUNCTION: `FUNCTION(collections)` gets a dict of layout name -> the
    example collection soagen allocated (at the element counts, pitches and device it chose,
    already filled with its default values) and writes realistic values into it in place."""

    def __init__(self, text: str, function: typing.Callable[..., object], path: Path) -> None:
        self.text = text
        self.function = function
        self.path = path

    def __call__(
        self,
        binding: type[ModelBinding],
        collections: Mapping[str, Collection],
        bounds: Mapping[str, str],
    ) -> None:
        from soagen.runtime.model import indices_outside

        try:
            with _folder_importable(self.path):  # for the sibling modules it imports when called
                returned = self.function(dict(collections))
        except Exception as error:
            raise CommandError(
                f"--examples {self.text} raised {type(error).__name__}"
                f"{_raised_at(error, self.path)}: {error}"
            ) from error
        if returned is not None:
            raise CommandError(
                f"--examples {self.text} returned {type(returned).__name__}: it must fill the "
                f"collections it is given in place and return None (soagen chose their sizes "
                f"and pitches)",
                usage=True,
            )
        specs = {spec.name: spec for spec in binding.INPUTS}
        for index_name, bound_name in bounds.items():
            indices = collections[specs[index_name].block.layout].block(specs[index_name].block)
            bound = collections[specs[bound_name].block.layout].size
            found = indices_outside(indices.cpu(), bound)
            if found is not None:
                raise CommandError(
                    f"--examples {self.text} left input {index_name!r} with indices "
                    f"{found[0]}..{found[1]}, outside [0, {bound}), the elements of "
                    f"{bound_name!r}"
                )


def load_examples(text: str) -> ExampleFill:
    """The --examples function ("file.py:function"), imported but not called yet."""
    with _imported_function(text, "--examples", "e.g. examples/gnn_model.py:fill_examples") as (
        function,
        _,
        path,
    ):
        parameters = inspect.signature(function).parameters
        required = [
            p
            for p in parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(required) > 1 or not (
            required or any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
        ):
            raise CommandError(
                f"--examples {text}: the function takes one argument, the dict of layout name "
                f"-> example collection it fills; it takes ({', '.join(parameters)})",
                usage=True,
            )
        return ExampleFill(text, function, path)


@contextlib.contextmanager
def _imported_function(
    text: str, option: str, example: str
) -> Iterator[tuple[typing.Callable[..., object], ModuleType, Path]]:
    """The function that `text` ("file.py:function") names, its module and file, with the file's
    folder importable (as `python FILE.py` has it) while the block runs."""
    path_text, sep, function_name = text.rpartition(":")
    if not sep or not path_text or not function_name.isidentifier():
        raise CommandError(f"{option} takes FILE.py:FUNCTION ({example}), got {text!r}", usage=True)
    path = Path(path_text)
    if not path.is_file():
        raise CommandError(
            f"{option.removeprefix('--')} file {path_text!r} does not exist", usage=True
        )
    name = f"_soagen_factory_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CommandError(f"{path_text} is not a Python file Python can import", usage=True)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with _folder_importable(path):
            try:
                spec.loader.exec_module(module)
            except Exception as error:
                raise CommandError(
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
                raise CommandError(
                    f"{path_text} has no function {function_name!r}"
                    + (f"; it defines {', '.join(defined)}" if defined else ""),
                    usage=True,
                )
            yield function, module, path
    finally:
        sys.modules.pop(name, None)


@contextlib.contextmanager
def _folder_importable(path: Path) -> Iterator[None]:
    """The folder of `path` first on `sys.path` while the block runs, as `python FILE.py` has
    it: a factory or --examples file imports the modules beside it."""
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


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


def resolve_index_bounds(
    binding: type[ModelBinding], given: Mapping[str, str] | None, module: ModuleType
) -> dict[str, str]:
    """Index input -> the input whose elements it indexes: the schema's `indexes` clauses, then
    `given` (--index) or else the factory module's `INDEX_BOUNDS`."""
    source = "--index"
    if given is None:
        given = getattr(module, "INDEX_BOUNDS", None) or {}
        source = "the factory module's INDEX_BOUNDS"
        if not isinstance(given, Mapping):
            raise CommandError(f"{source} must be a dict of input names", usage=True)
    inputs = {spec.name: spec for spec in binding.INPUTS}
    # The schema's `indexes` clauses first: --index or INDEX_BOUNDS add to them or replace them.
    bounds = declared_index_bounds(binding.INPUTS)
    for index_name, bound_name in given.items():
        for name in (index_name, bound_name):
            if name not in inputs:
                raise CommandError(
                    f"{source}: {binding.NAME} has no input {name!r}; its inputs are "
                    f"{', '.join(inputs)}",
                    usage=True,
                )
        dtype = inputs[index_name].block.dtype
        if dtype not in INTEGER_DTYPES:
            raise CommandError(
                f"{source}: input {index_name!r} holds {dtype}, not integer indices", usage=True
            )
        bounds[str(index_name)] = str(bound_name)
    return bounds


def example_sizes(
    binding: type[ModelBinding], layouts: Mapping[str, type[Collection]]
) -> dict[str, int]:
    """The example's element count of each input layout (see `EXAMPLE_MULTIPLE`); layouts that
    `same n as` ties share their group's first layout's count."""
    groups = same_n_groups(binding)
    counts: dict[str, int] = {}
    for i, name in enumerate(groups):
        counts[name] = layouts[name].ALIGNMENT * (EXAMPLE_MULTIPLE + 2 * i) + 1
    return {name: counts[groups[name]] for name in groups}


def trial_sizes(
    example: Mapping[str, int],
    bases: Sequence[int] = CHECK_BASES,
    groups: Mapping[str, str] | None = None,
) -> list[dict[str, int]]:
    """The element counts to check a model at: the example's, then for each of `bases` one set
    with `base + 5 * i` elements in the i-th layout (different per layout, so that a size or
    stride one layout's count fixed by mistake shows), but one count per `same_n_groups` group."""
    groups = groups or {name: name for name in example}
    order = list(example)
    return [dict(example)] + [
        {name: base + 5 * order.index(groups[name]) for name in example} for base in bases
    ]


def example_inputs(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    sizes: Mapping[str, int],
    bounds: Mapping[str, str],
    device: torch.device,
    seed: int,
    fill: ExampleFill | None = None,
) -> list[torch.Tensor]:
    """Block views of `example_collections`; the schema's `contiguous` inputs as the copies a
    binding makes of them."""
    collections = example_collections(binding, layouts, sizes, bounds, device, seed, fill)
    return [
        contiguous_copy(view) if spec.contiguous else view
        for spec, view in (
            (spec, collections[spec.block.layout].block(spec.block)) for spec in binding.INPUTS
        )
    ]


def example_collections(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    sizes: Mapping[str, int],
    bounds: Mapping[str, str],
    device: torch.device,
    seed: int,
    fill: ExampleFill | None = None,
) -> dict[str, Collection]:
    """Freshly allocated collections of each input layout, filled with valid data: indices in
    range of their bound, other integers 0 (they may index something the schema does not say),
    floats random; then `fill` (--examples) may write realistic values into them."""
    generator = torch.Generator().manual_seed(seed)
    collections = {name: layouts[name].allocate(n, device, zero=True) for name, n in sizes.items()}
    specs = {spec.name: spec for spec in binding.INPUTS}
    for spec in binding.INPUTS:
        view = collections[spec.block.layout].block(spec.block)
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
    if fill is not None:
        fill(binding, collections, bounds)
    return collections


class SchemaOrder(torch.nn.Module):
    """The model with its outputs as a tuple in the schema's order, checked as a binding checks
    them (`outputs_in_schema_order`: dict keys, output count): OutputError if they do not fit."""

    def __init__(self, model: torch.nn.Module, binding: type[ModelBinding]) -> None:
        super().__init__()
        self.model = model
        self.binding = binding

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(outputs_in_schema_order(self.binding, self.model(*inputs)))


def check_eager(
    binding: type[ModelBinding], model: SchemaOrder, inputs: Sequence[torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], set[int]]:
    """The model must run on the example and return what the output blocks hold: its results,
    and the positions of the inputs it writes into."""
    try:
        results, written = run_on_copies(model, inputs)
    except OutputError as error:  # from SchemaOrder: what it returns does not fit the outputs
        raise CommandError(str(error)) from error
    except Exception as error:
        raise CommandError(
            f"the model fails on example inputs of {binding.NAME} "
            f"({describe_inputs(binding, inputs)}): {type(error).__name__}: {error}"
        ) from error
    for spec, result in zip(binding.OUTPUTS, results, strict=True):
        block = spec.block
        if str(result.dtype).removeprefix("torch.") != block.dtype or result.dim() != len(
            block.axes
        ):
            raise CommandError(
                f"output {spec.name!r} is {result.dtype} {list(result.shape)}; the block "
                f"{block.layout}{{{', '.join(block.members)}}} holds {block.dtype} with axes "
                f"[{', '.join(block.axes)}]"
            )
    return results, written


def run_on_copies(
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


@dataclass(frozen=True, slots=True)
class Trial:
    """The eager model run on real collections of one set of element counts."""

    sizes: dict[str, int]  # input layout -> element count
    inputs: list[torch.Tensor]
    expected: tuple[torch.Tensor, ...]


def eager_trials(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    model: torch.nn.Module,
    example: Mapping[str, int],
    bounds: Mapping[str, str],
    device: torch.device,
    fill: ExampleFill | None,
) -> list[Trial]:
    """The eager model at several element counts, different per layout (`trial_sizes`), each on
    inputs of its own seed: what a compiled model is compared with, and where a size or stride the
    export fixed by mistake shows. Counts the eager model itself refuses (n = 1, say) are left
    out."""
    trials = []
    for seed, sizes in enumerate(trial_sizes(example, groups=same_n_groups(binding)), start=1):
        inputs = example_inputs(binding, layouts, sizes, bounds, device, seed=seed, fill=fill)
        try:
            expected, _ = run_on_copies(model, inputs)
        except Exception:
            continue
        # A model may return views of its own state, which the next trial would overwrite.
        trials.append(Trial(sizes, inputs, tuple(result.clone() for result in expected)))
    return trials


def describe_inputs(binding: type[ModelBinding], inputs: Sequence[torch.Tensor]) -> str:
    """`name [shape] dtype` of each input, for error messages."""
    return ", ".join(
        f"{spec.name} {list(view.shape)} {str(view.dtype).removeprefix('torch.')}"
        for spec, view in zip(binding.INPUTS, inputs, strict=True)
    )


def check_agreement(
    binding: type[ModelBinding],
    what: str,
    actual: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    sizes: Mapping[str, int],
    fill: ExampleFill | None = None,
) -> None:
    """`what`'s outputs must agree with the eager model's, run on inputs of `sizes` (filled by
    `fill`, if given); the eager results must be finite, or the comparison proves nothing."""
    check_finite(binding, expected, sizes, fill)
    names = [spec.name for spec in binding.OUTPUTS]
    found = first_disagreement(names, actual, expected)
    if found is not None:
        raise CommandError(
            f"{what} disagrees with the eager model on output {found.output!r} for "
            f"{_shown(sizes)}: {found.detail}"
        )


def check_finite(
    binding: type[ModelBinding],
    results: Sequence[torch.Tensor],
    sizes: Mapping[str, int],
    fill: ExampleFill | None = None,
) -> None:
    """The eager model's results on example inputs must be finite: a NaN or infinite reference
    makes any check against it meaningless, and usually means the example values are not what
    the model expects (random four-vectors with negative masses, say)."""
    found = nonfinite_outputs([spec.name for spec in binding.OUTPUTS], results)
    if found:
        described = "; ".join(f"{name!r}: {count} of {total}" for name, count, total in found)
        remedy = (
            "The example floats are random normals: give realistic values with --examples "
            "FILE.py:FUNCTION, a function that fills the example collections in place"
            if fill is None
            else f"Make the values --examples {fill.text} writes realistic for the model"
        )
        raise CommandError(
            f"the eager model itself returns NaN or infinite values on the example inputs "
            f"({_shown(sizes)}; {described}), so nothing can be checked against it. {remedy}"
        )


def _shown(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{name} n={n}" for name, n in sizes.items())


__all__ = [
    "CHECK_BASES",
    "EXAMPLE_MULTIPLE",
    "SchemaOrder",
    "build_model",
    "check_agreement",
    "check_eager",
    "check_finite",
    "load_examples",
    "describe_inputs",
    "example_inputs",
    "example_sizes",
    "ExampleFill",
    "forget_generated_modules",
    "generated_binding",
    "layout_classes",
    "resolve_index_bounds",
    "same_n_groups",
    "run_on_copies",
    "torch_device",
    "trial_sizes",
]
