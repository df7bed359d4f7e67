"""AOTInductor packages (`.pt2`) built by `soagen compile`, run on collections' views as they are.

A package holds one model compiled ahead of time for one device type, plus soagen's metadata (the
`aot_inductor.metadata` config, read back with `load_metadata_from_package`): the binding it was built
for (model name; every input and output with its layout, members, dtype, axes and the block's byte
geometry at a few element counts), the soagen and torch versions that built it, the device type, the
index bounds, and each input's symbolic sizes and strides as exported. Loading compares all of that
with the generated binding class and refuses, naming what differs, a package built for another schema
or layout: a compiled model reads its inputs with the strides it was exported with, so a layout that
moved a column would silently read the wrong bytes.

The compiled code reads every stride it was not told is fixed from the input tensors (see
`soagen.build.compile`), so one package serves any element count and slices of collections, and the views
go in with no copy. AOTInductor checks none of this at run time (only with the process-wide
`AOTI_RUNTIME_CHECK_INPUTS=1`), so each runner checks dtypes, sizes and strides against the exported
expressions first: a few integer comparisons, where a mismatch would otherwise read out of bounds.

Thread safety: AOTInductor's model container hands each call a free model instance under a mutex
(`run_single_threaded=False`, one instance), so one runner serves any number of threads; calls on
one device run one at a time, each using the intra-op thread pool. A binding with `graphs=True`
loads the single-threaded entry point instead (`AotBackend.single_threaded`; see
`soagen.runtime.graphs`), whose calls it makes under a lock.
"""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import soagen
from soagen.runtime.backends import Backend, Runner
from soagen.runtime.errors import BindingError, ModelLoadError
from soagen.runtime.spec import BindingSpec, following_input

if typing.TYPE_CHECKING:
    import torch

    from soagen.runtime.model import ModelBinding

# Key of soagen's entry in the package's user metadata; its value is one JSON document.
METADATA_KEY = "soagen"
# Version of that document's structure; bumped when it changes incompatibly.
METADATA_FORMAT = 1
# Element counts at which each block's geometry is recorded and compared: 0 and 1 for the corner
# cases, and counts whose byte sizes fall between alignment multiples, so that another alignment or
# column order shows in the offsets and pitches.
PROBE_SIZES = (0, 1, 37, 1000, 4097)
# The package's model name: `aoti_compile_and_package` stores a single model under this name.
PACKAGE_MODEL = "model"


def describe_binding(binding: type[ModelBinding]) -> dict[str, object]:
    """What a package must match: the model's name and every binding with its block geometry."""
    return {
        "model": binding.NAME,
        "inputs": [describe_spec(spec) for spec in binding.INPUTS],
        "outputs": [describe_spec(spec) for spec in binding.OUTPUTS],
    }


def describe_spec(spec: BindingSpec) -> dict[str, object]:
    block = spec.block
    geometry = {}
    for n in PROBE_SIZES:
        view = block.view(n)
        geometry[str(n)] = {
            "shape": list(view.shape),
            "strides": list(view.strides),
            "offset": view.offset,
        }
    described: dict[str, object] = {
        "name": spec.name,
        "direction": spec.direction,
        "layout": block.layout,
        "block": block.name,
        "members": list(block.members),
        "dtype": block.dtype,
        "axes": list(block.axes),
        "geometry": geometry,
    }
    if spec.contiguous:  # exported as a row-major copy; absent otherwise, as older packages have it
        described["contiguous"] = True
    if spec.same_n_as is not None:  # exported with one size for both; absent otherwise, as above
        described["same_n_as"] = spec.same_n_as
    return described


def read_metadata(path: Path) -> dict[str, typing.Any]:
    """soagen's metadata of a package, without loading its compiled code."""
    import torch

    try:
        # A static method the stubs of torch 2.13 lack: it reads the JSON, not the compiled code.
        loader: typing.Any = torch._C._aoti.AOTIModelPackageLoader
        entries = loader.load_metadata_from_package(str(path), PACKAGE_MODEL)
    except Exception as error:  # the loader raises RuntimeError or c10::Error subclasses
        raise ModelLoadError(f"{path} is not a readable AOTInductor package: {error}") from None
    check_machine(path, entries)
    text = entries.get(METADATA_KEY)
    if text is None:
        raise ModelLoadError(
            f"{path} is an AOTInductor package not built by `soagen compile`: it carries no soagen "
            f"metadata, so nothing says which schema and layout its inputs follow. Build it with "
            f"`soagen compile SCHEMA --model NAME --factory FILE.py:FUNCTION -o {path.name}`"
        )
    try:
        metadata = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"{path}: soagen metadata is not valid JSON ({error})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != METADATA_FORMAT:
        found = metadata.get("format") if isinstance(metadata, dict) else None
        raise ModelLoadError(
            f"{path}: soagen metadata format {found!r} is not {METADATA_FORMAT}, the one soagen "
            f"{soagen.__version__} reads; rebuild the package with `soagen compile`"
        )
    check_instruction_sets(path, metadata.get("cpu_flags"))
    # AOTInductor's own record of the GPU it built kernels for (major * 10 + minor), which its
    # loader only logs a warning about.
    metadata[COMPUTE_CAPABILITY_KEY] = entries.get("AOTI_COMPUTE_CAPABILITY", "")
    return metadata


def _release(version: str) -> str:
    """`2.13.0+cpu` -> `2.13.0`: the build variant does not change the AOTInductor ABI."""
    return version.split("+", 1)[0]


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


# Where `read_metadata` puts the package's GPU compute capability ("90"; "" or "None" on CPU).
COMPUTE_CAPABILITY_KEY = "aoti_compute_capability"
# AOTInductor's CUDA kernels assume the 16-byte alignment of the blocks they were exported with.
GPU_ALIGNMENT = 16

# CPU vector extensions in increasing order, as torch names them (`get_cpu_capability`).
_CPU_LEVELS = ("DEFAULT", "AVX2", "AVX512")


def check_machine(path: Path, entries: Mapping[str, str]) -> None:
    """A CPU package holds machine code built with `-march=native`: refuse another architecture,
    and a CPU without the vector extensions it was built for (it would die on an illegal
    instruction instead of raising)."""
    import platform

    import torch

    built_machine = entries.get("AOTI_MACHINE")
    if built_machine and built_machine != platform.machine():
        raise ModelLoadError(
            f"{path} was compiled for {built_machine} CPUs; this one is {platform.machine()}. "
            f"Build the package on the machine family that runs it"
        )
    if entries.get("AOTI_DEVICE_KEY", "cpu") != "cpu":
        return
    built_isa = (entries.get("AOTI_CPU_ISA") or "").split()
    flags = cpu_flags()
    if flags is not None:
        # Every extension the build used (`avx512 avx512_vnni`, `... amx_tile`), by Linux's name.
        missing = [
            isa
            for isa in built_isa
            if isa.lower() in _LINUX_FLAGS and _LINUX_FLAGS[isa.lower()] not in flags
        ]
        if missing:
            raise ModelLoadError(
                f"{path} was compiled for CPUs with {' '.join(built_isa)}; this CPU lacks "
                f"{' '.join(missing)}. Build the package on the machine family that runs it"
            )
        return
    here = torch.backends.cpu.get_cpu_capability()
    if built_isa and built_isa[0] in _CPU_LEVELS and here in _CPU_LEVELS:
        if _CPU_LEVELS.index(built_isa[0]) > _CPU_LEVELS.index(here):
            raise ModelLoadError(
                f"{path} was compiled for CPUs with {' '.join(built_isa)}; this CPU offers {here}. "
                f"Build the package on the machine family that runs it"
            )


# torch's names of x86 vector extensions (AOTI_CPU_ISA, lowercased) and the cpuinfo flag of each;
# names not listed (another architecture's, a later torch's) are not compared.
_LINUX_FLAGS = {
    "avx2": "avx2",
    "avx512": "avx512f",
    "avx512_vnni": "avx512_vnni",
    "amx_tile": "amx_tile",
}


# /proc/cpuinfo flags that name x86 instruction-set extensions: what `-march=native` lets the
# compiler use anywhere in a package's code, whichever level AOTI_CPU_ISA records.
_INSTRUCTION_SET_PREFIXES = ("sse", "ssse", "avx", "amx", "fma")
_INSTRUCTION_SETS = frozenset(
    "abm adx aes bmi1 bmi2 clflushopt clwb cx16 f16c gfni lzcnt movbe movdir64b movdiri "
    "pclmulqdq popcnt rdrnd rdseed serialize sha_ni tbm vaes vpclmulqdq xop".split()
)


def instruction_sets() -> list[str] | None:
    """This CPU's instruction-set extensions by their /proc/cpuinfo flags, sorted; None where
    Linux does not list x86 flags. `soagen compile` records them in packages built with
    `-march=native`."""
    flags = cpu_flags()
    if flags is None:
        return None
    return sorted(
        flag
        for flag in flags
        if flag in _INSTRUCTION_SETS or flag.startswith(_INSTRUCTION_SET_PREFIXES)
    )


def check_instruction_sets(path: Path, built_with: object) -> None:
    """Refuse a package on a CPU that lacks an extension of the CPU it was compiled on
    (`built_with`, recorded by `soagen compile`): its C++ may use any of them."""
    flags = cpu_flags()
    if not isinstance(built_with, list) or flags is None:
        # Not recorded (built for a named target, by soagen 0.2.0, on another architecture), or
        # this CPU's flags are not readable here.
        return
    missing = [flag for flag in built_with if flag not in flags]
    if missing:
        raise ModelLoadError(
            f"{path} was compiled (-march=native) on a CPU with {' '.join(missing)}, which this "
            f"CPU lacks: its code may use them and would die on an illegal instruction. Build "
            f"the package on the machine family that runs it"
        )


def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags as Linux's /proc/cpuinfo lists them; None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def check_versions(path: Path, metadata: Mapping[str, typing.Any]) -> None:
    import torch

    built_torch = str(metadata.get("torch_version"))
    if _release(built_torch) != _release(torch.__version__):
        raise ModelLoadError(
            f"{path} was compiled with torch {built_torch}, but torch {torch.__version__} is "
            f"running: AOTInductor packages run only on the torch release that built them. "
            f"Rebuild it with `soagen compile` under this torch"
        )
    built_soagen = str(metadata.get("soagen_version"))
    if _major_minor(built_soagen) != _major_minor(soagen.__version__):
        raise ModelLoadError(
            f"{path} was built by soagen {built_soagen}, but soagen {soagen.__version__} is "
            f"installed, whose layouts may differ; rebuild it with `soagen compile`"
        )


def binding_differences(built: Mapping[str, typing.Any], binding: type[ModelBinding]) -> list[str]:
    """Every way the package's recorded binding differs from the generated class, as sentences."""
    current = describe_binding(binding)
    problems: list[str] = []
    if built.get("model") != current["model"]:
        problems.append(f"it is model {built.get('model')!r}, not {current['model']!r}")
    for role in ("inputs", "outputs"):
        old = {entry["name"]: entry for entry in built.get(role, [])}
        new = {
            entry["name"]: entry
            for entry in typing.cast(list[dict[str, typing.Any]], current[role])
        }
        if list(old) != list(new):
            problems.append(
                f"its {role} are {', '.join(old) or 'none'}; {binding.NAME}'s are "
                f"{', '.join(new) or 'none'}"
            )
        for name in old.keys() & new.keys():
            problems += _spec_differences(role[:-1], name, old[name], new[name])
    return problems


def _spec_differences(
    role: str, name: str, old: Mapping[str, typing.Any], new: Mapping[str, typing.Any]
) -> list[str]:
    def shown(value: object) -> str:
        return ", ".join(map(str, value)) if isinstance(value, list) else str(value)

    where = f"{role} {name!r}"
    problems = [
        f"{where}: {field} {shown(old.get(field))} in the package, {shown(new[field])} here"
        for field in ("direction", "layout", "members", "dtype", "axes")
        if old.get(field) != new[field]
    ]
    if old.get("contiguous", False) != new.get("contiguous", False):
        exported = "row-major copies" if old.get("contiguous") else "the strided views"
        problems.append(
            f"{where}: exported for {exported}, but the schema "
            + ("declares" if new.get("contiguous") else "does not declare")
            + " `contiguous`"
        )
    if old.get("same_n_as") != new.get("same_n_as"):
        problems.append(
            f"{where}: "
            + (
                f"exported with the element count of {old['same_n_as']!r}"
                if old.get("same_n_as")
                else "exported with an element count of its own"
            )
            + ", but the schema "
            + (
                f"declares `same n as {new['same_n_as']}`"
                if new.get("same_n_as")
                else "declares no `same n as`"
            )
        )
    if problems:
        return problems
    for n, view in new["geometry"].items():
        recorded = old.get("geometry", {}).get(n)
        if recorded != view:
            before = "missing" if recorded is None else _geometry_text(recorded)
            problems.append(
                f"{where}: the byte layout of {new['layout']} differs (alignment or column order?): "
                f"for n={n} the package has {before}, this schema {_geometry_text(view)}"
            )
            break
    return problems


def _geometry_text(view: Mapping[str, typing.Any]) -> str:
    return (
        f"shape {tuple(view.get('shape', ()))}, strides {tuple(view.get('strides', ()))}, "
        f"offset {view.get('offset')}"
    )


class AotBackend(Backend):
    """An AOTInductor package made by `soagen compile` for this binding, loaded per device."""

    kind = "aot"
    records_autograd = False  # the package's C++ runner never builds autograd graphs
    moves_version_counters = False  # its writes bypass them: `writes_inputs` records them

    def __init__(self, path: Path, binding: type[ModelBinding]) -> None:
        metadata = read_metadata(path)
        check_versions(path, metadata)
        problems = binding_differences(metadata.get("binding", {}), binding)
        if problems:
            raise ModelLoadError(
                f"{path} was built for another schema or layout than {binding.NAME} "
                f"({binding.SCHEMA}): " + "; ".join(problems) + ". Rebuild it with `soagen compile`"
            )
        super().__init__(
            f"{path} ({metadata['binding']['model']} for {metadata.get('device')}, torch "
            f"{metadata.get('torch_version')})"
        )
        self.path = path
        self.binding = binding
        self.metadata = metadata
        self.device_type = str(metadata.get("device", "cpu")).split(":", 1)[0]
        self._index_bounds: dict[str, str] = dict(metadata.get("index_bounds", {}))
        # Recorded only where the build checked that the package refuses a bad index before
        # writing anything (CPU, see `soagen.build.compile`); older packages have none.
        self.index_ranges_checked = types.MappingProxyType(
            dict(metadata.get("index_ranges_checked", {}))
        )
        self.writes_outputs = bool(metadata.get("writes_outputs", False))
        self.writes_inputs = tuple(metadata.get("writes_inputs", ()))
        # A misaligned block the package reads is cloned inside it (correct, a copy and a warning
        # per call); one it writes must be staged here, or the results land in that clone.
        self.output_alignment: int | None = (
            GPU_ALIGNMENT if self.writes_outputs and self.device_type == "cuda" else None
        )
        specs = (*binding.INPUTS, *binding.OUTPUTS) if self.writes_outputs else binding.INPUTS
        self._check = _InputCheck(binding, specs, metadata.get("input_geometry", []))
        # Whether runners load the package's single-threaded entry point, which records no CUDA
        # event per call: a binding with graphs=True sets it, since an event recorded while a graph
        # is captured cannot be queried by the next run, and it calls the runner under one lock.
        self.single_threaded = False

    @property
    def index_bounds(self) -> Mapping[str, str]:
        """Index inputs recorded at compile time (`--index`), each with the input it indexes."""
        return dict(self._index_bounds)

    @property
    def output_counts(self) -> Mapping[str, str]:
        """An output block's element count as the package was exported with it: a number (one
        total per event, say), or the symbol of an input's element count, named by that input."""
        geometry = self.metadata.get("input_geometry", [])
        inputs, outputs = self.binding.INPUTS, self.binding.OUTPUTS
        if not self.writes_outputs or len(geometry) != len(inputs) + len(outputs):
            return {}
        symbols: dict[str, list[BindingSpec]] = {}
        for spec, entry in zip(inputs, geometry[: len(inputs)], strict=True):
            size = _element_count(spec, entry)
            if size is not None and not size.isdigit():
                symbols.setdefault(size, []).append(spec)
        counts = {}
        for spec, entry in zip(outputs, geometry[len(inputs) :], strict=True):
            size = _element_count(spec, entry)
            if size is not None and size.isdigit():
                counts[spec.name] = size
            elif size is not None and size in symbols:
                counts[spec.name] = following_input(symbols[size], spec).name
        return counts

    def place(self, device: torch.device) -> Runner:
        import torch

        if device.type != self.device_type:
            raise ModelLoadError(
                f"{self.path} was compiled for {self.device_type}; it cannot run on {device}. "
                f"Build a package for it with `soagen compile ... --device {device.type}`"
            )
        index = -1
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            check_compute_capability(self.path, self.metadata, index)
        try:
            # torch's loader itself, as `aoti_load_package` makes it (one model instance, calls
            # under its mutex), without importing torch._inductor (~1.7 s at the first load) for
            # the device checks done above.
            loader_class: typing.Any = torch._C._aoti.AOTIModelPackageLoader
            loader = loader_class(str(self.path), PACKAGE_MODEL, self.single_threaded, 1, index)
        except Exception as error:  # a broken archive or a library that does not load here
            raise ModelLoadError(f"cannot load {self.path} on {device}: {error}") from None
        # The loader's `run` takes the flat input list and returns the flat outputs, which
        # `soagen compile` exported in schema order; it skips the pytree round trip of
        # `AOTICompiledModel.__call__`. On CUDA it runs on the current stream of the current
        # device, so the data's device is made current for the call.
        run_compiled = loader.run
        first_output = len(self.binding.INPUTS)
        alignment = self.output_alignment
        if device.type != "cuda" and alignment is None:  # CPU: the call, no more
            return _CheckedRunner(self._check, run_compiled)  # it takes any sequence of tensors
        on_device: Callable[[], typing.ContextManager[object]] = (
            (lambda: torch.cuda.device(index)) if device.type == "cuda" else contextlib.nullcontext
        )

        def run_guarded(inputs: Sequence[torch.Tensor]) -> object:
            with on_device():
                if alignment is None:
                    return run_compiled(list(inputs))
                return _run_staged(run_compiled, inputs, first_output, alignment)

        return _CheckedRunner(self._check, run_guarded)

    def on_fixed_inputs(self, device: torch.device, inputs: Sequence[torch.Tensor]) -> Runner:
        """The package's runner without its per-call geometry check, which these inputs pass
        now: a call plan's arguments keep their shapes and strides."""
        runner = self.on(device)
        if not isinstance(runner, _CheckedRunner):
            return runner
        runner.check(inputs)
        return runner.unchecked


class _CheckedRunner:
    """A package's runner: the input geometry checked (`_InputCheck`), then the call."""

    __slots__ = ("check", "unchecked")

    def __init__(self, check: _InputCheck, unchecked: Runner) -> None:
        self.check = check
        self.unchecked = unchecked

    def __call__(self, inputs: Sequence[torch.Tensor]) -> object:
        self.check(inputs)
        return self.unchecked(inputs)


def _run_staged(
    run_compiled: Callable[[list[torch.Tensor]], object],
    inputs: Sequence[torch.Tensor],
    first_output: int,
    alignment: int,
) -> object:
    """Run a package that writes its outputs, giving each output block that does not start on
    `alignment` bytes an aligned stand-in, copied into the caller's block after the call."""
    import torch

    staged = list(inputs)
    moved = [i for i in range(first_output, len(staged)) if staged[i].data_ptr() % alignment]
    for i in moved:
        block = staged[i]
        staged[i] = torch.empty_strided(
            block.shape, block.stride(), dtype=block.dtype, device=block.device
        )
    result = run_compiled(staged)
    for i in moved:
        inputs[i].copy_(staged[i])
    return result


def check_compute_capability(path: Path, metadata: Mapping[str, typing.Any], index: int) -> None:
    """A CUDA package holds kernels built for one GPU generation: refuse another one here, which
    would fail later with a raw CUDA error."""
    import torch

    built = str(metadata.get(COMPUTE_CAPABILITY_KEY) or "")
    if not built.isdigit():
        return
    major, minor = torch.cuda.get_device_capability(index)
    built_major, built_minor = int(built) // 10, int(built) % 10
    # Machine code for one major generation runs on its later minors (8.0 on 8.6), no further.
    if built_major != major or built_minor > minor:
        raise ModelLoadError(
            f"{path} was compiled for GPUs of compute capability {built_major}.{built_minor}; "
            f"cuda:{index} has {major}.{minor}. Build the package on the GPU family that runs it"
        )


# Integer expressions of symbolic sizes and strides, as sympy prints them ("s77", "3*s15", "4").
_OPERATORS: dict[type[ast.AST], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_Evaluate = Callable[[Mapping[str, int]], int]


def _compile_expression(text: str) -> _Evaluate | None:
    """An evaluator for a sympy-printed integer expression, or None for anything unusual."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None

    def build(node: ast.AST) -> _Evaluate | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
            return lambda symbols: value
        if isinstance(node, ast.Name):
            name = node.id
            return lambda symbols: symbols[name]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = build(node.operand)
            return None if inner is None else (lambda symbols: -inner(symbols))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            apply = _OPERATORS[type(node.op)]
            left, right = build(node.left), build(node.right)
            if left is None or right is None:
                return None
            return lambda symbols: apply(left(symbols), right(symbols))
        return None

    return build(tree)


_ACCEPTED_GEOMETRIES = 1024  # bounded: sizes vary per event


def _element_count(spec: BindingSpec, entry: Mapping[str, typing.Any]) -> str | None:
    """The size along n (a number or a symbol) a package's recorded geometry gives a block."""
    axes, sizes = spec.block.axes, entry.get("sizes", [])
    if "n" not in axes or len(sizes) != len(axes):
        return None
    return str(sizes[axes.index("n")])


class _InputCheck:
    """Checks the package's arguments (the inputs, and the output blocks of a package that writes
    them) against the sizes and strides it was exported with."""

    def __init__(
        self,
        binding: type[ModelBinding],
        specs: Sequence[BindingSpec],
        geometry: Sequence[Mapping[str, typing.Any]],
    ):
        self.binding = binding
        self.inputs: list[tuple[BindingSpec, list[str], list[str]]] = []
        self.evaluators: dict[str, _Evaluate | None] = {}
        # Geometries that passed: a loop over events of similar sizes repeats them, and a lookup
        # costs a fraction of evaluating the exported expressions again.
        self.accepted: set[tuple[object, ...]] = set()
        if len(geometry) != len(specs):
            return  # nothing recorded: the binding comparison already matched the blocks
        for spec, entry in zip(specs, geometry, strict=True):
            sizes = [str(size) for size in entry.get("sizes", [])]
            strides = [str(stride) for stride in entry.get("strides", [])]
            self.inputs.append((spec, sizes, strides))
            for text in (*sizes, *strides):
                if not text.isidentifier() and text not in self.evaluators:
                    self.evaluators[text] = _compile_expression(text)

    def __call__(self, tensors: Sequence[torch.Tensor]) -> None:
        if not self.inputs:
            return
        geometry = tuple([(t.dtype, t.shape, t.stride()) for t in tensors])
        if geometry in self.accepted:
            return
        self._check(tensors)
        if len(self.accepted) >= _ACCEPTED_GEOMETRIES:
            self.accepted.clear()
        self.accepted.add(geometry)

    def _check(self, tensors: Sequence[torch.Tensor]) -> None:
        from soagen.runtime.buffers import TORCH_DTYPES

        symbols: dict[str, int] = {}
        origin: dict[str, str] = {}
        deferred: list[tuple[str, int, str]] = []
        if len(tensors) != len(self.inputs):
            names = ", ".join(spec.name for spec, _, _ in self.inputs)
            raise BindingError(
                f"{self.binding.NAME}: the package takes {len(self.inputs)} tensors ({names}), "
                f"got {len(tensors)}"
            )
        for (spec, sizes, strides), tensor in zip(self.inputs, tensors, strict=True):
            expected = TORCH_DTYPES[spec.block.dtype]
            if tensor.dtype != expected or tensor.dim() != len(sizes):
                raise BindingError(
                    f"{self.binding.NAME}: {spec.direction} {spec.name!r} is {tensor.dtype} "
                    f"{list(tensor.shape)}; the package takes {expected} with "
                    f"{len(sizes)} axes ({', '.join(spec.block.axes)})"
                )
            shape, stride = tensor.shape, tensor.stride()
            for axis, text in enumerate(sizes):
                what = f"size of {spec.direction} {spec.name!r} along axis {spec.block.axes[axis]}"
                deferred += self._bind(symbols, origin, text, shape[axis], what)
            for axis, text in enumerate(strides):
                if shape[axis] > 1:  # a stride along 0 or 1 elements is never used
                    what = f"stride of {spec.direction} {spec.name!r} along axis {spec.block.axes[axis]}"
                    deferred += self._bind(symbols, origin, text, stride[axis], what)
        for text, actual, what in deferred:
            evaluate = self.evaluators.get(text)
            if evaluate is None:
                continue
            try:
                wanted = evaluate(symbols)
            except KeyError:
                continue  # depends on a stride that no input pinned down
            if wanted != actual:
                raise BindingError(
                    f"{self.binding.NAME}: the {what} is {actual}, but the package was exported "
                    f"with {text} = {wanted}; only collections of its schema's layouts fit"
                )

    @staticmethod
    def _bind(
        symbols: dict[str, int], origin: dict[str, str], text: str, actual: int, what: str
    ) -> list[tuple[str, int, str]]:
        if not text.isidentifier():
            return [(text, actual, what)]
        known = symbols.get(text)
        if known is None:
            symbols[text] = actual
            origin[text] = what
        elif known != actual:
            hint = " (one collection bound to both?)" if what.startswith("stride") else ""
            raise BindingError(
                f"the {what} is {actual}, but the {origin[text]} is {known}: the package was "
                f"exported with them equal{hint}"
            )
        return []
