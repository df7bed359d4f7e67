"""`soagen triton`: write one model of a schema into a Triton model repository.

    REPO/NAME/config.pbtxt                 derived from the schema (soagen.serving.model_config)
    REPO/NAME/VERSION/model.pt             --backend pytorch: TorchScript for Triton's libtorch backend
    REPO/NAME/VERSION/model.onnx           --backend onnxruntime: the --package ONNX model adapted to
                                           the wire form (soagen.serving.onnx_entry)
    REPO/NAME/VERSION/model.py             --backend python: runs soagen's runtime (python_model)
    REPO/NAME/VERSION/soagen_model.json      what model.py runs
    REPO/NAME/VERSION/soagen_generated/      the schema's generated modules
    REPO/NAME/VERSION/model.pt2              --runtime aot: the AOTInductor package
    REPO/NAME/VERSION/model.pt               --runtime torchscript
    REPO/NAME/VERSION/factory.py, weights.pt --runtime eager or compile: the factory file and the
                                             weights of the model it built

The model folder is written next to its final place and moved there when complete; a folder that
soagen wrote before is replaced, any other is left alone (an error). Every model file is checked
before it is written: the model runs on example collections of the schema and must return what the
output blocks hold, and a TorchScript module must agree with the eager model at two sets of element
counts. An onnxruntime entry's model.onnx is run by ONNX Runtime on wire tensors that soagen's
client encodes from example collections, at several sets of element counts, and must agree with the
--package model run on contiguous copies of the same blocks.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
import typing
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import jinja2

import soagen
from soagen.dsl.ir import Model, Schema
from soagen.dsl.loader import load
from soagen.generator.pyformat import comment_text
from soagen.generator.python import generate
from soagen.runtime.spec import declared_index_bounds
from soagen.serving.events import (
    OutputSizeError,
    RecordedSizeError,
    binding_output_sizes,
    writes_over_inputs,
)
from soagen.serving.model_config import (
    RUNTIMES,
    ModelConfig,
    Options,
    TritonError,
    build_config,
    find_model,
    output_sizes,
    render,
)
from soagen.serving.python_model import (
    FACTORY_FILE,
    GENERATED_PACKAGE,
    SPEC_FILE,
    SPEC_FORMAT,
    WEIGHTS_FILE,
)
from soagen.serving.wire import DEFAULT_MAX_QUEUE_DELAY_US

if typing.TYPE_CHECKING:
    import torch

    from soagen.build.model import ExampleFill
    from soagen.runtime.collection import Collection
    from soagen.runtime.model import ModelBinding

Progress = Callable[[str], None]
# The first line of every config.pbtxt soagen writes: a folder whose config starts so is ours.
MARK = "# Written by soagen "


@dataclass(frozen=True, slots=True)
class Request:
    schema: Path
    model: str
    repository: Path
    backend: str = "python"
    runtime: str | None = None  # python backend: None follows --package, else eager
    factory: str | None = None  # FILE.py:FUNCTION
    examples: str | None = None  # FILE.py:FUNCTION filling example collections (`ExampleFill`)
    columnwise: bool = False  # runtime aot from a factory: `soagen compile --columnwise`
    write_outputs: bool = False  # runtime aot from a factory: `soagen compile --write-outputs`
    package: Path | None = None  # a .pt2 (soagen compile) or .pt (TorchScript) file
    name: str | None = None
    version: int = 1
    naming: str | None = None
    device: str = "cpu"  # "cpu" or "gpu"
    instances: int = 1
    gpus: tuple[int, ...] = ()
    max_batch_size: int | None = None  # None: 64 (python backend), 0 (pytorch)
    max_queue_delay_us: int = DEFAULT_MAX_QUEUE_DELAY_US
    merge_events: bool = False
    output_sizes: Mapping[str, str] = field(default_factory=dict)
    index_bounds: Mapping[str, str] | None = None  # None: the factory's or the package's


@dataclass(frozen=True, slots=True)
class Written:
    folder: Path
    config: ModelConfig
    runtime: str | None
    files: tuple[str, ...]  # relative to `folder`, sorted


def write_model(request: Request, progress: Progress | None = None) -> Written:
    """Write `request.model` of the schema into the repository; SchemaError for schema errors, and
    for what does not fit (usage errors flagged) a `CommandError`: TritonError, `soagen compile`'s
    CompileError, or one of the `soagen.build.model` helpers'."""
    report = progress or (lambda line: None)
    schema = load(request.schema).unwrap()
    schema_path = request.schema.as_posix()
    model = find_model(schema, request.model, schema_path)
    runtime = _runtime(request)
    for option, given in (
        ("--columnwise", request.columnwise),
        ("--write-outputs", request.write_outputs),
    ):
        if given and (runtime != "aot" or request.factory is None):
            raise TritonError(
                f"{option} is an option of `soagen compile`, which builds the package here: it "
                f"needs --runtime aot and --factory",
                usage=True,
            )
    if request.examples is not None and request.factory is None and runtime == "aot":
        raise TritonError(
            "--examples fills the example collections a model is checked on here, and a .pt2 "
            "package is not checked again: give --factory, or leave --examples out",
            usage=True,
        )
    if request.naming == "forward" and request.package is not None and runtime == "aot":
        raise TritonError(
            "--naming forward needs the forward's argument names, which a .pt2 package does "
            "not keep: give --factory, or another --naming",
            usage=True,
        )
    if request.version < 1:
        raise TritonError(f"--version must be 1 or more, got {request.version}", usage=True)
    if request.instances < 1:
        raise TritonError(f"--instances must be 1 or more, got {request.instances}", usage=True)
    for option, value in (
        ("--max-batch-size", request.max_batch_size),
        ("--max-queue-delay-us", request.max_queue_delay_us),
    ):
        if value is not None and value < 0:
            raise TritonError(f"{option} must be 0 or more, got {value}", usage=True)
    if request.gpus and request.device != "gpu":
        raise TritonError("--gpus needs --device gpu", usage=True)
    options = Options(
        backend=request.backend,
        naming=request.naming,
        name=request.name,
        max_batch_size=request.max_batch_size,
        max_queue_delay_us=request.max_queue_delay_us,
        merge_events=request.merge_events,
        kind=request.device,
        count=request.instances,
        gpus=request.gpus,
    )
    # Everything the schema alone decides is checked before any model is built.
    placeholder = tuple(binding.name for binding in model.inputs)
    planned = build_config(
        schema, model.name, replace(options, forward_names=placeholder), schema_path=schema_path
    )
    # Binding name -> tensor name: an onnxruntime entry's graph is named after the config.
    names = {
        binding.name: tensor.name
        for binding, tensor in zip(
            (*model.inputs, *model.outputs), (*planned.inputs, *planned.outputs), strict=True
        )
    }
    sizes: dict[str, dict[str, object]] = {}
    if request.backend == "python":
        try:
            sizes = output_sizes(schema, model.name, request.output_sizes, schema_path=schema_path)
        except TritonError:
            if runtime != "aot":
                raise
            # A package may record what is missing: decided once it is there (`_build`).
    if request.backend != "python" and request.output_sizes:
        raise TritonError(
            f"--output-size is for --backend python: the {request.backend} backend returns what "
            f"the model returns",
            usage=True,
        )
    name = options.name or model.name
    repository = request.repository
    target = repository / name
    _check_replaceable(target)
    repository.mkdir(parents=True, exist_ok=True)
    staging = repository / f".{name}.soagen-{uuid.uuid4().hex[:8]}"
    try:
        version = staging / str(request.version)
        version.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="soagen-triton-") as workdir:
            built = _build(request, runtime, names, Path(workdir), version, report)
        sizes = built.output_sizes if built.output_sizes is not None else sizes
        config = build_config(
            schema,
            model.name,
            replace(options, forward_names=built.forward_names),
            schema_path=schema_path,
        )
        (staging / "config.pbtxt").write_text(render(config), encoding="utf-8")
        if request.backend == "python":
            _write_python_model(
                schema, schema_path, model, config, built, sizes, request.merge_events, version
            )
        _replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    files = sorted(
        path.relative_to(target).as_posix() for path in target.rglob("*") if path.is_file()
    )
    return Written(target, config, runtime if request.backend == "python" else None, tuple(files))


# What an onnxruntime entry runs: the --package file, adapted.
ONNXRUNTIME = "onnxruntime"


def _runtime(request: Request) -> str:
    """The runtime: what model.py runs (python backend), or "torchscript" (pytorch backend)."""
    package_kind = None
    if request.package is not None:
        if not request.package.is_file():
            raise TritonError(f"--package {request.package.as_posix()}: no such file", usage=True)
        if request.factory is not None:
            raise TritonError("give --factory or --package, not both", usage=True)
        from soagen.runtime.backends import file_kind
        from soagen.runtime.errors import ModelLoadError

        try:
            package_kind = file_kind(request.package)
        except ModelLoadError as error:
            raise TritonError(f"--package: {error}", usage=True) from None
    elif request.factory is None:
        raise TritonError(
            "give --factory FILE.py:FUNCTION (a function returning the nn.Module) or --package "
            "FILE (.pt2 from `soagen compile`, or TorchScript .pt)",
            usage=True,
        )
    if request.backend == ONNXRUNTIME:
        if request.package is None or package_kind != ONNXRUNTIME:
            raise TritonError(
                "--backend onnxruntime serves an ONNX model: give --package FILE.onnx (exported "
                "for contiguous [n, c, ...] tensors in each binding's declared order, with a "
                "dynamic element dimension)",
                usage=True,
            )
        if request.runtime is not None:
            raise TritonError(
                f"--runtime {request.runtime} is for --backend python; Triton's onnxruntime "
                f"backend runs the ONNX model itself",
                usage=True,
            )
        return ONNXRUNTIME
    if package_kind == ONNXRUNTIME:
        raise TritonError(
            f"--package {request.package}: an ONNX model is served with --backend onnxruntime",
            usage=True,
        )
    if request.backend == "pytorch":
        if request.runtime not in (None, "torchscript"):
            raise TritonError(
                f"--runtime {request.runtime}: Triton's PyTorch backend runs TorchScript; the "
                f"other runtimes run with --backend python",
                usage=True,
            )
        if package_kind == "aot":
            raise TritonError(
                "--backend pytorch runs TorchScript (.pt); serve a .pt2 package with --backend "
                "python",
                usage=True,
            )
        return "torchscript"
    runtime = request.runtime or package_kind or "eager"
    if runtime not in RUNTIMES:
        raise TritonError(
            f"--runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}", usage=True
        )
    if package_kind is not None and package_kind != runtime:
        needs = {
            "aot": "a .pt2 package from `soagen compile`",
            "torchscript": "a TorchScript .pt file",
        }.get(runtime, "--factory: it builds the model in the server")
        from soagen.runtime.backends import FILE_KINDS

        raise TritonError(
            f"--package {request.package} is {FILE_KINDS[package_kind]}; --runtime {runtime} "
            f"needs {needs}",
            usage=True,
        )
    return runtime


def _check_replaceable(target: Path) -> None:
    if not target.exists():
        return
    config = target / "config.pbtxt"
    try:
        first = config.read_text(encoding="utf-8").splitlines()[:1]
    except (OSError, UnicodeDecodeError):
        first = []
    if not target.is_dir() or not first or not first[0].startswith(MARK):
        raise TritonError(
            f"{target.as_posix()} exists and was not written by soagen: remove it, or give "
            f"another --name",
            usage=True,
        )


def _replace(staging: Path, target: Path) -> None:
    """Move the complete model folder into place; a previous soagen folder goes only then."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.soagen-old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class _Built:
    runtime: str
    model_file: str | None
    factory: dict[str, str] | None
    index_bounds: dict[str, str]
    forward_names: tuple[str, ...] | None
    # The Python backend's output sizes where a package's record has a say (`_sizes_for_package`).
    output_sizes: dict[str, dict[str, object]] | None = None


def _build(
    request: Request,
    runtime: str,
    names: Mapping[str, str],
    workdir: Path,
    version: Path,
    report: Progress,
) -> _Built:
    """The model file(s) in the version folder; needs torch. For the Python backend and a
    package, also the output sizes its model.py allocates (`_sizes_for_package`)."""
    try:
        import torch  # noqa: F401  (imported here to say so where it is missing)
    except ModuleNotFoundError:
        raise TritonError(
            "soagen triton needs torch: pip install 'soagen[torch]'", usage=True
        ) from None
    from soagen.build.model import forget_generated_modules, generated_binding

    binding, layouts = generated_binding(request.schema, request.model, workdir)
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript, which Triton's PyTorch backend still runs.
            warnings.filterwarnings(
                "ignore", message=r".*torch\.jit.*deprecated", category=DeprecationWarning
            )
            if runtime == ONNXRUNTIME:
                return _from_onnx(request, binding, layouts, names, version, report)
            build = _from_package if request.factory is None else _from_factory
            built = build(request, runtime, binding, layouts, version, report)
            if request.backend == "python" and built.runtime == "aot" and built.model_file:
                package = version / built.model_file
                sizes = _sizes_for_package(binding, package, request.output_sizes)
                return replace(built, output_sizes=sizes)
            return built
    finally:
        forget_generated_modules(binding)


def _from_factory(
    request: Request,
    runtime: str,
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    version: Path,
    report: Progress,
) -> _Built:
    import torch

    from soagen.build.compile import compile_model
    from soagen.build.model import build_model, resolve_index_bounds

    assert request.factory is not None
    report(f"building the model ({request.factory})")
    model, module = build_model(request.factory, torch.device("cpu"))
    bounds = resolve_index_bounds(binding, request.index_bounds, module)
    if runtime == "aot":
        _check_writes_apart(binding, request.write_outputs)
        device = "cuda" if request.device == "gpu" else "cpu"
        compile_model(
            request.schema,
            request.model,
            request.factory,
            output=version / "model.pt2",
            device=device,
            index_bounds=bounds,
            columnwise=request.columnwise,
            write_outputs=request.write_outputs,
            examples=request.examples,
            progress=report,
        )
        from soagen.runtime.aot import AotBackend

        _check_reads_only(AotBackend(version / "model.pt2", binding).writes_inputs, request.factory)
        return _Built("aot", "model.pt2", None, bounds, _argument_names(model))
    checked = _check_model(binding, layouts, model, bounds, request.examples)
    if runtime == "torchscript":
        report("converting to TorchScript")
        scripted, names = _torchscript(binding, layouts, model, bounds, checked)
        torch.jit.save(scripted, str(version / "model.pt"))
        return _Built("torchscript", "model.pt", None, bounds, names)
    # eager or compile: the factory file and the weights it made, loaded again in the server.
    path_text, _, function = request.factory.rpartition(":")
    shutil.copyfile(path_text, version / FACTORY_FILE)
    torch.save(model.state_dict(), version / WEIGHTS_FILE)
    factory = {"file": FACTORY_FILE, "function": function, "weights": WEIGHTS_FILE}
    return _Built(runtime, None, factory, bounds, _argument_names(model))


def _check_writes_apart(binding: type[ModelBinding], writes_outputs: bool) -> None:
    """model.py loads each event into one collection per layout, inputs and outputs alike."""
    problem = writes_over_inputs(binding) if writes_outputs else None
    if problem is not None:
        raise TritonError(f"{problem}; use a package that returns its outputs", usage=True)


def _sizes_for_package(
    binding: type[ModelBinding], package: Path, given: Mapping[str, str]
) -> dict[str, dict[str, object]]:
    """The output sizes model.py allocates for a package: `--output-size`, else what a package
    that writes its outputs recorded (`AotBackend.output_counts`), else the schema's rule; a
    given size that contradicts the record would fail every event, and is refused now."""
    from soagen.runtime.aot import AotBackend

    try:
        return binding_output_sizes(binding, given, AotBackend(package, binding).output_counts)
    except RecordedSizeError as error:
        raise TritonError(f"--output-size: {error}", usage=True) from None
    except OutputSizeError as error:
        raise TritonError(str(error), usage=True) from None


def _check_reads_only(written: Sequence[str], source: str) -> None:
    """model.py loads packages as they are: one that writes into its inputs (`written`, recorded
    by `soagen compile`) would be refused when the server starts; say so now."""
    if written:
        raise TritonError(
            f"{source}: the model writes into its input(s) {', '.join(written)}, which soagen "
            f"refuses to run without protected copies; make the model leave its inputs as they "
            f"are (out-of-place operations, or a clone first)",
            usage=True,
        )


def _from_package(
    request: Request,
    runtime: str,
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    version: Path,
    report: Progress,
) -> _Built:
    import torch

    from soagen.runtime.errors import ModelLoadError

    assert request.package is not None
    package = request.package
    if runtime == "aot":
        from soagen.runtime.aot import AotBackend

        try:
            backend = AotBackend(package, binding)
        except ModelLoadError as error:
            raise TritonError(str(error), usage=True) from None
        wanted = "cuda" if request.device == "gpu" else "cpu"
        if backend.device_type != wanted:
            raise TritonError(
                f"{package} was compiled for {backend.device_type}; --device {request.device} "
                f"needs a package compiled with `soagen compile ... --device {wanted}`",
                usage=True,
            )
        _check_writes_apart(binding, backend.writes_outputs)
        _check_reads_only(backend.writes_inputs, str(package))
        bounds = declared_index_bounds(binding.INPUTS)
        bounds.update(backend.index_bounds)
        bounds.update(request.index_bounds or {})
        report(f"copying {package.as_posix()}")
        shutil.copyfile(package, version / "model.pt2")
        return _Built("aot", "model.pt2", None, bounds, None)
    module = torch.jit.load(str(package), map_location="cpu")  # type: ignore[no-untyped-call]
    bounds = declared_index_bounds(binding.INPUTS)
    bounds.update(request.index_bounds or {})
    checked = _check_model(binding, layouts, module, bounds, request.examples)
    names = _torchscript_names(module)
    _verify(binding, layouts, module, checked, bounds, what=f"{package}")
    report(f"copying {package.as_posix()}")
    shutil.copyfile(package, version / "model.pt")
    return _Built("torchscript", "model.pt", None, bounds, names)


def _from_onnx(
    request: Request,
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    names: Mapping[str, str],
    version: Path,
    report: Progress,
) -> _Built:
    """model.onnx: the --package model adapted to the wire form, checked against the original
    model on example collections before it is written."""
    from soagen.runtime.errors import ModelLoadError
    from soagen.runtime.onnx import import_onnx
    from soagen.serving.onnx_entry import entry_model

    assert request.package is not None
    package = request.package
    try:
        onnx, _ = import_onnx()
    except ModelLoadError as error:
        raise TritonError(str(error), usage=True) from None
    try:
        original = onnx.load(str(package))
    except Exception as error:  # protobuf's DecodeError and onnx's own, by version
        raise TritonError(f"{package} is not an ONNX model: {error}", usage=True) from None
    report(f"adapting {package.as_posix()} to the wire form")
    try:
        entry = entry_model(original, binding, names, package.as_posix())
    except ModelLoadError as error:  # the model does not fit the schema's bindings
        raise TritonError(str(error), usage=True) from None
    bounds = declared_index_bounds(binding.INPUTS)
    bounds.update(request.index_bounds or {})
    fill = None
    if request.examples is not None:
        from soagen.build.model import load_examples

        fill = load_examples(request.examples)
    entry_bytes = entry.SerializeToString()
    report("checking the entry's model against the original on example events")
    check_onnx_entry(
        binding, layouts, original.SerializeToString(), entry_bytes, names, bounds, fill, package
    )
    (version / "model.onnx").write_bytes(entry_bytes)
    return _Built(ONNXRUNTIME, "model.onnx", None, bounds, None)


def check_onnx_entry(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    original: bytes,
    entry: bytes,
    names: Mapping[str, str],
    bounds: Mapping[str, str],
    fill: ExampleFill | None,
    source: Path,
) -> None:
    """The entry's graph, fed by ONNX Runtime what a client sends Triton (soagen's own encoding of
    example collections, batch axis included) and read back as the client reads the response,
    must agree with the original model on contiguous copies of the same blocks: at the example's
    element counts and the small ones `soagen compile` checks; TritonError naming the output and
    the counts otherwise."""
    import numpy as np
    import torch

    from soagen.build.model import (
        check_finite,
        example_collections,
        example_sizes,
        same_n_groups,
        trial_sizes,
    )
    from soagen.runtime.agreement import first_disagreement
    from soagen.runtime.onnx import import_onnx
    from soagen.serving.client import _declared_tensor, _host_array, _wire_source
    from soagen.serving.onnx_entry import entry_wire_tensors, schema_ports

    onnx, onnxruntime = import_onnx()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    cpu = ["CPUExecutionProvider"]
    try:
        served = onnxruntime.InferenceSession(entry, options, providers=cpu)
        reference = onnxruntime.InferenceSession(original, options, providers=cpu)
    except Exception as error:  # onnxruntime's exception types vary by version
        raise TritonError(
            f"ONNX Runtime cannot load {source} or the entry built from it: {error}"
        ) from None
    wires_in, wires_out = entry_wire_tensors(binding)
    ports_in, ports_out, _ = schema_ports(onnx.load_from_string(original), binding, str(source))
    sizes = example_sizes(binding, layouts)
    for seed, trial in enumerate(trial_sizes(sizes, groups=same_n_groups(binding))):
        collections = example_collections(
            binding, layouts, trial, bounds, torch.device("cpu"), seed, fill
        )
        views = [collections[spec.block.layout].block(spec.block) for spec in binding.INPUTS]
        feeds = {}
        for spec, wire in zip(binding.INPUTS, wires_in, strict=True):
            host, _ = _host_array(
                _wire_source(collections[spec.block.layout], spec.block, wire), wire
            )
            # The bytes Triton hands its backend: C order, batch axis of 1 (`set_data_from_numpy`).
            feeds[names[spec.name]] = np.ascontiguousarray(host[None])
        inputs = {
            port.name: view.contiguous().numpy() for port, view in zip(ports_in, views, strict=True)
        }
        outputs = [port.name for port in ports_out]
        expected = [torch.from_numpy(value) for value in reference.run(outputs, inputs)]
        check_finite(binding, expected, trial, fill)
        answered = served.run([names[spec.name] for spec in binding.OUTPUTS], feeds)
        actual = []
        for spec, wire, value, want in zip(
            binding.OUTPUTS, wires_out, answered, expected, strict=True
        ):
            shape = wire.wire_shape(tuple(want.shape))
            if tuple(value.shape) != shape:  # what the client refuses (`RemoteBinding._read`)
                raise TritonError(
                    f"the onnxruntime entry built from {source} answers {spec.name!r} with "
                    f"shape {list(value.shape)}, the client expects {list(shape)}"
                )
            actual.append(_declared_tensor(value[0], wire))
        found = first_disagreement([spec.name for spec in binding.OUTPUTS], actual, expected)
        if found is not None:
            counts = ", ".join(f"{name} n={n}" for name, n in trial.items())
            raise TritonError(
                f"the onnxruntime entry soagen built from {source} disagrees with the original "
                f"model on output {found.output!r} at {counts}: {found.detail}; nothing was "
                f"written. Report it to soagen with the model"
            )


# Checking and converting models.


@dataclass(frozen=True, slots=True)
class _Checked:
    """The eager model, wrapped to return its outputs in schema order, its example element counts
    and what fills the example collections (--examples)."""

    wrapped: torch.nn.Module
    sizes: dict[str, int]
    fill: ExampleFill | None


def _check_model(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    model: torch.nn.Module,
    bounds: Mapping[str, str],
    examples: str | None,
) -> _Checked:
    """The model must run on example collections (filled by `examples`, --examples, if given)
    and return finite values that fit the output blocks."""
    import torch

    from soagen.build.model import (
        SchemaOrder,
        check_eager,
        check_finite,
        example_inputs,
        example_sizes,
        load_examples,
    )

    fill = None if examples is None else load_examples(examples)
    wrapped = SchemaOrder(model, binding)
    sizes = example_sizes(binding, layouts)
    inputs = example_inputs(binding, layouts, sizes, bounds, torch.device("cpu"), 0, fill)
    results, _ = check_eager(binding, wrapped, inputs)
    check_finite(binding, results, sizes, fill)
    return _Checked(wrapped, sizes, fill)


def _torchscript(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    model: torch.nn.Module,
    bounds: Mapping[str, str],
    checked: _Checked,
) -> tuple[torch.jit.ScriptModule, tuple[str, ...] | None]:
    """`torch.jit.script` of the model where it scripts and returns tensors (a tensor, tuple or
    list: what Triton's PyTorch backend reads); else a trace of it returning a tuple in schema
    order, whose forward has no meaningful argument names."""
    import torch

    from soagen.build.model import example_inputs

    reason = ""
    try:
        scripted = torch.jit.script(model)
        output = scripted.forward.schema.returns[0].type  # type: ignore[attr-defined]
        if not _returns_tensors(str(output)):
            reason = f"its scripted forward returns {output}, not tensors"
    except Exception as error:
        reason = f"torch.jit.script failed ({type(error).__name__}: {str(error).splitlines()[0]})"
    if not reason:
        _verify(binding, layouts, scripted, checked, bounds, what="the scripted model")
        return scripted, _torchscript_names(scripted)
    inputs = example_inputs(
        binding, layouts, checked.sizes, bounds, torch.device("cpu"), 0, checked.fill
    )
    try:
        with torch.no_grad():
            example = tuple(v.contiguous() for v in inputs)
            traced = torch.jit.trace(checked.wrapped, example)  # type: ignore[no-untyped-call]
    except Exception as error:
        raise TritonError(
            f"the model does not convert to TorchScript: {reason}; torch.jit.trace failed too "
            f"({type(error).__name__}: {str(error).splitlines()[0]})"
        ) from None
    _verify(binding, layouts, traced, checked, bounds, what=f"the traced model ({reason})")
    return traced, None


def _returns_tensors(type_text: str) -> bool:
    return type_text == "Tensor" or (
        type_text.startswith(("Tuple[", "List[", "(")) and "Dict" not in type_text
    )


def _torchscript_names(module: torch.jit.ScriptModule) -> tuple[str, ...] | None:
    arguments = module.forward.schema.arguments  # type: ignore[attr-defined]
    return tuple(str(argument.name) for argument in arguments[1:])


def _argument_names(model: torch.nn.Module) -> tuple[str, ...] | None:
    parameters = inspect.signature(model.forward).parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return tuple(p.name for p in parameters if p.kind in kinds)


def _verify(
    binding: type[ModelBinding],
    layouts: Mapping[str, type[Collection]],
    module: torch.jit.ScriptModule,
    checked: _Checked,
    bounds: Mapping[str, str],
    *,
    what: str,
) -> None:
    """`module` on contiguous inputs (what Triton hands a backend) must agree with the eager model,
    at the example's element counts and at other ones, different per layout."""
    import torch

    from soagen.build.model import (
        CHECK_BASES,
        check_agreement,
        example_inputs,
        same_n_groups,
        trial_sizes,
    )
    from soagen.runtime.model import outputs_in_schema_order

    # The example's counts and one other set: the largest of the small ones compile checks.
    trials = trial_sizes(checked.sizes, CHECK_BASES[-1:], same_n_groups(binding))
    for seed, sizes in enumerate(trials, start=1):
        inputs = example_inputs(
            binding, layouts, sizes, bounds, torch.device("cpu"), seed, checked.fill
        )
        contiguous = [view.contiguous() for view in inputs]
        with torch.no_grad():
            expected = checked.wrapped(*inputs)
            try:
                actual = outputs_in_schema_order(binding, module(*contiguous))
            except Exception as error:
                raise TritonError(f"{what} fails: {type(error).__name__}: {error}") from None
        check_agreement(binding, what, actual, expected, sizes, checked.fill)


# The Python backend's files.


def _write_python_model(
    schema: Schema,
    schema_path: str,
    model: Model,
    config: ModelConfig,
    built: _Built,
    sizes: Mapping[str, Mapping[str, object]],
    merge_events: bool,
    version: Path,
) -> None:
    package = version / GENERATED_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    for module_name, text in sorted(generate(schema).items()):
        (package / f"{module_name}.py").write_text(text, encoding="utf-8")
    declaring = next(f for f in schema.files if model in f.models)
    spec = {
        "format": SPEC_FORMAT,
        "soagen_version": soagen.__version__,
        "schema": schema_path,
        "module": declaring.module_name,
        "model": model.name,
        "runtime": built.runtime,
        "model_file": built.model_file,
        "factory": built.factory,
        "index_bounds": built.index_bounds,
        "max_batch_size": config.max_batch_size,
        "merge_events": merge_events,
        "inputs": [
            {
                "binding": binding.name,
                "tensor": tensor.name,
                "dims": list(tensor.dims),
                "scalar": not tensor.variable,
            }
            for binding, tensor in zip(model.inputs, config.inputs, strict=True)
        ],
        "outputs": [
            {
                "binding": binding.name,
                "tensor": tensor.name,
                "dims": list(tensor.dims),
                "size": dict(sizes[binding.name]),
            }
            for binding, tensor in zip(model.outputs, config.outputs, strict=True)
        ],
    }
    (version / SPEC_FILE).write_text(
        json.dumps(spec, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    text = _template().render(
        version=soagen.__version__,
        model=model.name,
        schema=comment_text(schema_path),
        name=config.name,
        runtime=built.runtime,
    )
    (version / "model.py").write_text(text, encoding="utf-8")


def _template() -> jinja2.Template:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("soagen.serving", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return environment.get_template("model.py.jinja")
