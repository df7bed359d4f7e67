"""What a repository's `model.py` runs inside Triton's Python backend: soagen's runtime on each
request's tensors.

`soagen triton --backend python` writes, in the model's version folder, `model.py` (which imports
this module from the Python that runs the backend's stub), `soagen_model.json` (what to run: the
binding, the runtime, the tensor names, how large each output's collection is per event, the index
bounds), the schema's generated modules in `soagen_generated/` and the model file (`model.pt2`,
`model.pt`, or `factory.py` with `weights.pt`).

Tensors travel in soagen's wire form, the one `soagen serve` speaks (`soagen.serving.wire`): each
block with its axes in storage order (`node_features` of `as [n, c]` as `[b, 4, n]`), bfloat16 as
its raw bits (UINT16), after Triton's batch axis. Every request's tensors carry b events of equal
shapes (usually b = 1; `max_batch_size` >= 1, ragged inputs). Per event, every input tensor is
copied into its block of a freshly allocated collection on the instance's device (one copy per
block, from the wire order into the layout's pitches: a compiled package reads its inputs with the
SoA strides it was exported with; `soagen.serving.events`, which `soagen serve` shares), the model
runs through `ModelBinding.run` with all of its checks (index ranges, outputs, inputs left
unmodified), and each output block is returned in its wire order.

By default the events of one `execute` call run one by one. With `merge_events`, they become one
collection per layout, each event's elements after the previous event's, index inputs
(`index_bounds`) shifted by the offset of the collection they index, so the model runs once;
outputs are split back per event. That is only right for models that treat events independently,
element by element or through the declared index inputs (message passing over edges, say), not for
models that reduce over a whole collection.

A request that does not fit (missing input, wrong shape or dtype, indices out of range) gets its own
error response; the other requests of the call still run.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import typing
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import soagen
from soagen.runtime.collection import Collection
from soagen.runtime.model import ModelBinding
from soagen.runtime.spec import BindingSpec
from soagen.serving.events import Event, EventError, EventInput, EventLoader
from soagen.serving.wire import WireTensor, declared_order, wire_tensor

if typing.TYPE_CHECKING:
    import torch

SPEC_FILE = "soagen_model.json"
SPEC_FORMAT = 2  # 2: tensors in the wire form of soagen.serving.wire
GENERATED_PACKAGE = "soagen_generated"
FACTORY_FILE = "factory.py"
WEIGHTS_FILE = "weights.pt"


@dataclass(frozen=True, slots=True)
class _Output:
    tensor: str
    spec: BindingSpec
    wire: WireTensor
    layout: type[Collection]
    size: Mapping[str, object]  # {"layout": L} | {"input": binding} | {"count": k}


def read_spec(folder: Path) -> dict[str, typing.Any]:
    path = folder / SPEC_FILE
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise RuntimeError(f"{path}: cannot read soagen's model description: {error}") from None
    if not isinstance(spec, dict) or spec.get("format") != SPEC_FORMAT:
        raise RuntimeError(
            f"{path} has format {spec.get('format') if isinstance(spec, dict) else None!r}, not "
            f"{SPEC_FORMAT}: write the repository again with `soagen triton`"
        )
    written = str(spec.get("soagen_version"))
    if written.split(".")[:2] != soagen.__version__.split(".")[:2]:
        raise RuntimeError(
            f"{path} was written by soagen {written}, but the Python running Triton's backend "
            f"stub ({sys.executable}) has soagen {soagen.__version__}: write the repository again "
            f"with this soagen, or install soagen {written} there"
        )
    return spec


def import_binding(folder: Path, spec: Mapping[str, typing.Any]) -> type[ModelBinding]:
    """The generated model class, from the modules written next to `model.py`."""
    package_folder = folder / GENERATED_PACKAGE
    package = f"_soagen_triton_{uuid.uuid4().hex}"
    module_spec = importlib.util.spec_from_file_location(
        package, package_folder / "__init__.py", submodule_search_locations=[str(package_folder)]
    )
    if module_spec is None or module_spec.loader is None:
        raise RuntimeError(f"{package_folder} is not an importable package")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[package] = module
    module_spec.loader.exec_module(module)
    generated = importlib.import_module(f"{package}.{spec['module']}")
    binding = getattr(generated, spec["model"], None)
    if not (isinstance(binding, type) and issubclass(binding, ModelBinding)):
        raise RuntimeError(
            f"{package_folder}: module {spec['module']} has no model {spec['model']}"
        )
    return binding


def _device(args: Mapping[str, str]) -> torch.device:
    import torch

    if args.get("model_instance_kind") == "GPU":
        return torch.device("cuda", int(args.get("model_instance_device_id", "0")))
    return torch.device("cpu")


def _load_model(
    folder: Path, spec: Mapping[str, typing.Any], binding: type[ModelBinding]
) -> ModelBinding:
    import torch

    runtime = spec["runtime"]
    bounds = dict(spec.get("index_bounds", {}))
    if runtime in ("aot", "torchscript"):
        return binding.load(folder / spec["model_file"], backend=runtime, index_bounds=bounds)
    factory = spec["factory"]
    path = folder / factory["file"]
    name = f"_soagen_triton_factory_{uuid.uuid4().hex}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise RuntimeError(f"{path} is not a Python file Python can import")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    model = getattr(module, factory["function"])()
    if factory.get("weights"):
        state = torch.load(folder / factory["weights"], map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    model.eval()
    return binding(model, backend=runtime, index_bounds=bounds)


class SoagenModel:
    """One model instance: `initialize` builds it, `execute` runs a list of requests."""

    def __init__(self, folder: Path, args: Mapping[str, str], pb_utils: typing.Any) -> None:
        spec = read_spec(folder)
        self.pb_utils = pb_utils
        self.name = str(args.get("model_name", spec["model"]))
        self.binding_class = import_binding(folder, spec)
        self.device = _device(args)
        self.model = _load_model(folder, spec, self.binding_class)
        self.merge = bool(spec.get("merge_events", False))
        module = sys.modules[self.binding_class.__module__]
        specs = {s.name: s for s in (*self.binding_class.INPUTS, *self.binding_class.OUTPUTS)}
        self.wires: dict[str, WireTensor] = {}  # binding name -> its tensor
        for entry in (*spec["inputs"], *spec["outputs"]):
            wire = replace(wire_tensor(specs[entry["binding"]]), name=entry["tensor"])
            if entry.get("scalar"):  # one value per event: 1 on the element axis
                wire = wire.one_value()
            if list(wire.dims) != list(entry["dims"]):
                raise RuntimeError(
                    f"{folder / SPEC_FILE}: tensor {wire.name!r} has dims {entry['dims']}, but the "
                    f"generated binding's block travels as {list(wire.dims)}: write the repository "
                    f"again with `soagen triton`"
                )
            self.wires[entry["binding"]] = wire
        inputs = [
            EventInput(
                tensor=entry["tensor"],
                spec=specs[entry["binding"]],
                dims=declared_order(self.wires[entry["binding"]]).dims,
                scalar=bool(entry.get("scalar", False)),
            )
            for entry in spec["inputs"]
        ]
        self.outputs = [
            _Output(
                tensor=entry["tensor"],
                spec=specs[entry["binding"]],
                wire=self.wires[entry["binding"]],
                layout=getattr(module, specs[entry["binding"]].block.layout),
                size=entry["size"],
            )
            for entry in spec["outputs"]
        ]
        layouts = {item.layout: getattr(module, item.layout) for item in inputs}
        layouts.update({o.spec.block.layout: o.layout for o in self.outputs})
        self.loader = EventLoader(inputs, layouts, self.model.index_bounds)

    # Requests in, responses out.

    def execute(self, requests: Sequence[typing.Any]) -> list[typing.Any]:
        pb_utils = self.pb_utils
        # Per request: its events' outputs, or an error message and whether the request caused it.
        results: list[list[dict[str, torch.Tensor]] | tuple[str, bool]] = []
        parsed: dict[int, list[Event]] = {}
        for position, request in enumerate(requests):
            try:
                parsed[position] = self._events(request)
            except EventError as error:
                results.append((f"{self.name}: {error}", True))
            else:
                results.append([])
        if self.merge and parsed:
            merged = [event for events in parsed.values() for event in events]
            try:
                outputs = self._run(merged)
            except Exception as error:  # the model's own error: every request of the call gets it
                for position in parsed:
                    results[position] = (_describe(self.name, error), False)
            else:
                for position, events in parsed.items():
                    results[position], outputs = outputs[: len(events)], outputs[len(events) :]
        else:
            for position, events in parsed.items():
                try:
                    results[position] = [self._run([event])[0] for event in events]
                except Exception as error:
                    results[position] = (_describe(self.name, error), False)
        responses = []
        for result in results:
            if isinstance(result, tuple):
                responses.append(pb_utils.InferenceResponse(error=self._error(*result)))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._tensors(result)))
        return responses

    def _error(self, message: str, invalid_request: bool) -> typing.Any:
        """A TritonError: INVALID_ARG (HTTP 400) for a request that does not fit, else INTERNAL.
        Error codes came with Triton 23.x's Python backend; older ones take the message only."""
        error_class = self.pb_utils.TritonError
        code = getattr(error_class, "INVALID_ARG" if invalid_request else "INTERNAL", None)
        return error_class(message) if code is None else error_class(message, code)

    def finalize(self) -> None:
        self.model = typing.cast(ModelBinding, None)

    def _events(self, request: typing.Any) -> list[Event]:
        """The request's events, each input checked against its block, in declared axis order."""
        from soagen.runtime.buffers import tensor_of

        tensors: dict[str, torch.Tensor] = {}
        for item in self.loader.inputs:
            wire = self.wires[item.spec.name]
            given = self.pb_utils.get_input_tensor_by_name(request, item.tensor)
            if given is None:
                raise EventError(f"input {item.tensor!r} is missing")
            array = given.as_numpy()
            if str(array.dtype) != wire.numpy_dtype:  # bfloat16's bits are reinterpreted below
                raise EventError(
                    f"input {item.tensor!r} holds {array.dtype}, expected {wire.numpy_dtype} "
                    f"({wire.datatype})"
                )
            problem = wire.shape_problem(array.shape, events=None)
            if problem is not None:
                raise EventError(f"input {item.tensor!r} {problem}")
            tensors[item.spec.name] = tensor_of(array, wire.dtype)
        counts = {name: int(t.shape[0]) for name, t in tensors.items()}
        if len(set(counts.values())) != 1:
            shown = ", ".join(f"{self.loader.tensor_name(n)} {c}" for n, c in counts.items())
            raise EventError(f"the inputs' batch sizes differ ({shown})")
        (count,) = set(counts.values())
        if count == 0:
            raise EventError("the request holds no events (batch size 0)")
        return [
            self.loader.event(
                {name: t[b].permute(self.wires[name].inverse) for name, t in tensors.items()}
            )
            for b in range(count)
        ]

    def _run(self, events: Sequence[Event]) -> list[dict[str, torch.Tensor]]:
        """Run events as one concatenation per layout; each event's outputs, by tensor name."""
        # Per event, each output's element count (once: it sizes the allocation and the split).
        sizes = [(o.spec.block.layout, o.size) for o in self.outputs]
        counts = [self.loader.counts(event, sizes) for event in events]
        collections, offsets = self.loader.load(events, self.device, [c for c, _ in counts])
        self.model.run(
            {i.spec.name: collections[i.layout] for i in self.loader.inputs},
            {o.spec.name: collections[o.spec.block.layout] for o in self.outputs},
        )
        results = []
        for placed, (_, ns) in zip(offsets, counts, strict=True):
            outputs = {}
            for output, n in zip(self.outputs, ns, strict=True):
                layout = output.spec.block.layout
                start = placed[layout]
                view = collections[layout].slice(start, start + n).block(output.spec.block)
                outputs[output.tensor] = view.permute(output.wire.order)  # wire order, a view
            results.append(outputs)
        return results

    def _tensors(self, events: Sequence[Mapping[str, torch.Tensor]]) -> list[typing.Any]:
        """Each output of the request's events, stacked along the batch axis on the host (the one
        copy of each output block) and handed to Triton as NumPy (bfloat16 as its bits)."""
        import torch

        from soagen.runtime.buffers import numpy_of

        tensors = []
        for output in self.outputs:
            parts = [event[output.tensor] for event in events]
            value = torch.empty((len(parts), *parts[0].shape), dtype=parts[0].dtype)
            for b, part in enumerate(parts):
                value[b].copy_(part)
            tensors.append(self.pb_utils.Tensor(output.tensor, numpy_of(value)))
        return tensors


def _describe(name: str, error: Exception) -> str:
    return f"{name}: {type(error).__name__}: {error}"
