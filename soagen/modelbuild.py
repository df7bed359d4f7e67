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

import importlib
import importlib.util
import inspect
import sys
import traceback
import typing
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import torch

from soagen.dsl.loader import load
from soagen.dtypes import INTEGER_DTYPES
from soagen.errors import CommandError
from soagen.generator.python import generate
from soagen.runtime.buffers import contiguous_copy
from soagen.runtime.collection import Collection
from soagen.runtime.errors import OutputError
from soagen.runtime.model import ModelBinding, outputs_in_schema_order
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
    path_text, sep, function_name = factory.rpartition(":")
    if not sep or not path_text or not function_name.isidentifier():
        raise CommandError(
            f"--factory takes FILE.py:FUNCTION (e.g. examples/gnn_model.py:build_model), got "
            f"{factory!r}",
            usage=True,
        )
    path = Path(path_text)
    if not path.is_file():
        raise CommandError(f"factory file {path_text!r} does not exist", usage=True)
    name = f"_soagen_factory_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CommandError(f"{path_text} is not a Python file Python can import", usage=True)
    module = importlib.util.module_from_spec(spec)
    # As `python FILE.py` would: the file's folder is importable, for its sibling modules.
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    try:
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
        try:
            model = function()
        except Exception as error:
            raise CommandError(
                f"{factory}() raised {type(error).__name__}{_raised_at(error, path)}: {error}"
            ) from error
    finally:
        sys.path.remove(str(path.resolve().parent))
        sys.modules.pop(name, None)
    if not isinstance(model, torch.nn.Module):
        raise CommandError(
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
    """The example's element count of each input layout (see `EXAMPLE_MULTIPLE`)."""
    names = list(dict.fromkeys(spec.block.layout for spec in binding.INPUTS))
    return {
        name: layouts[name].ALIGNMENT * (EXAMPLE_MULTIPLE + 2 * i) + 1
        for i, name in enumerate(names)
    }


def trial_sizes(
    example: Mapping[str, int], bases: Sequence[int] = CHECK_BASES
) -> list[dict[str, int]]:
    """The element counts to check a model at: the example's, then for each of `bases` one set
    with `base + 5 * i` elements in the i-th layout (different per layout, so that a size or
    stride one layout's count fixed by mistake shows)."""
    return [dict(example)] + [
        {name: base + 5 * i for i, name in enumerate(example)} for base in bases
    ]


def example_inputs(
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
    # The schema's `contiguous` inputs reach the model as the copies a binding makes of them.
    return [
        contiguous_copy(view) if spec.contiguous else view
        for spec, view in zip(binding.INPUTS, views, strict=True)
    ]


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
) -> None:
    """`what`'s outputs must agree with the eager model's, run on inputs of `sizes`."""
    for spec, got, want in zip(binding.OUTPUTS, actual, expected, strict=True):
        try:
            _assert_close(got, want)
        except AssertionError as error:
            shown = ", ".join(f"{name} n={n}" for name, n in sizes.items())
            raise CommandError(
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


__all__ = [
    "CHECK_BASES",
    "EXAMPLE_MULTIPLE",
    "SchemaOrder",
    "build_model",
    "check_agreement",
    "check_eager",
    "describe_inputs",
    "example_inputs",
    "example_sizes",
    "forget_generated_modules",
    "generated_binding",
    "layout_classes",
    "resolve_index_bounds",
    "run_on_copies",
    "torch_device",
    "trial_sizes",
]
