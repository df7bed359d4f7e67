"""Base class of generated model classes: bind SoA blocks as zero-copy inputs, run, write outputs back.

A call binds each input block of the schema as its strided view (no gather, no copy, no host<->device
transfer), runs the model on the device where the data lives, checks every output (count, shape, dtype,
device) before anything is written, then copies each output into its output block: one device-local copy.

Inputs are never silently modified: a model that writes into its inputs is caught through the tensor
version counters (each input is handed over with a counter of its own) and refused with
`InputModifiedError`, unless the caller asked for protected copies.
Writes that bypass autograd's bookkeeping (`.data`, `.numpy()`, raw pointers) leave the counters as
they were and are not seen: run such models with `protect_inputs=True`. AOT packages move no
counters either; `soagen compile` records the inputs a model writes, and loading such a package
without `protect_inputs=True` is refused.
Importing this module imports no torch; backends load when a model is first built.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import threading
import types
import typing
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence

from soagen.dsl.dtypes import INTEGER_DTYPES
from soagen.dsl.layout import round_up
from soagen.runtime.cpu import ensure_cpu_settings
from soagen.runtime.errors import (
    BindingError,
    IndexRangeError,
    InputModifiedError,
    OutputError,
    ReadOnlyCollectionError,
)
from soagen.runtime.geometry import ITEMSIZE
from soagen.runtime.index_kernel import queue_index_check
from soagen.runtime.spec import BindingSpec, declared_index_bounds

if typing.TYPE_CHECKING:
    import os

    import torch

    from soagen.runtime.backends import Backend, CompiledGraph, Runner
    from soagen.runtime.collection import Collection
    from soagen.runtime.graphs import CallGraphs

_M = typing.TypeVar("_M", bound="ModelBinding")

# Call plans one binding keeps: enough for the collections of a few events in flight at once.
_PLANS_PER_BINDING = 8

# Whether `ensure_cpu_settings` has run: after that it does nothing, and even calling it costs
# ~15 us once a model has pushed soagen's code out of the caches (n = 1e5, after the MLP).
_cpu_settled = False


def _settle_cpu() -> None:
    global _cpu_settled
    ensure_cpu_settings()
    _cpu_settled = True


class _CallPlan:
    """What a call with these collections needs that no call with them changes: made by the first
    call, after every check that depends on the collections alone (names, layouts, devices,
    read-only outputs, `same n as`, outputs over inputs); a collection's buffer, size and device
    are fixed for its life. Per call there remain the index range checks (values change), the
    version counters (models run from Python) and the output checks (a model's result can)."""

    __slots__ = (
        "call",
        "collections",
        "in_inference_mode",
        "index_checks",
        "key",
        "model_call",
        "model_index_checks",
        "views",
    )

    def __init__(
        self,
        key: tuple[int, ...],
        collections: tuple[weakref.ref[Collection], ...],
        views: list[torch.Tensor],
        in_inference_mode: bool | None,
        index_checks: tuple[_IndexCheck, ...],
        model_index_checks: tuple[_IndexCheck, ...],
        model_call: _ModelCall | None,
        call: typing.Callable[[], object] | None,
    ) -> None:
        self.key = key
        self.collections = collections  # weak: the plan leaves with the first one collected
        # The input views handed to the model every call. Where the backend moves version
        # counters (models run by ATen from Python), each has a counter of its own, and any write
        # through it, its shape changed in place included, moves it and drops the plan.
        self.views = views
        # Whether those views were made in inference mode (None: plain views, for backends that
        # move no counters).
        self.in_inference_mode = in_inference_mode
        self.index_checks = index_checks  # run before each call
        # Those the model runs itself (`Backend.index_ranges_checked`): run here only after it
        # failed, to name the values.
        self.model_index_checks = model_index_checks
        # The model's run on the views, its results checked and written (`_model_call`).
        self.model_call = model_call
        # The whole call as one function where nothing is left to do before the model: no index
        # check, no views to remake for a call outside inference mode (`_run_plan`); a CUDA
        # graph's replay, a call with every output empty. Else None.
        self.call = call


# (input position, its name, the bound input's name, that input's size)
_IndexCheck = tuple[int, str, str, int]
# A model's run on its input views, in schema order, returning its results in schema order.
_ModelCall = typing.Callable[[Sequence["torch.Tensor"]], list["torch.Tensor"]]


class ModelBinding:
    """One model, bound to the blocks its schema declares. Subclasses are generated."""

    NAME: typing.ClassVar[str]
    SCHEMA: typing.ClassVar[str]
    INPUTS: typing.ClassVar[tuple[BindingSpec, ...]]
    OUTPUTS: typing.ClassVar[tuple[BindingSpec, ...]]
    # The CUDA graphs of a binding made with graphs=True (`soagen.runtime.graphs`).
    _graphs: CallGraphs | None = None

    def __init__(
        self,
        model: object,
        *,
        backend: str | None = None,
        protect_inputs: bool = False,
        index_bounds: Mapping[str, str | None] | None = None,
        contiguous: Iterable[str] = (),
        fallback_to_eager: bool = False,
        backend_options: Mapping[str, object] | None = None,
        graphs: bool = False,
        graph_cache_size: int | None = None,
    ) -> None:
        """Wrap a model: an `nn.Module`, a TorchScript module, or a path to a `.pt`/`.pt2`/`.onnx`
        file.

        `backend` forces one of "eager", "torchscript", "compile", "aot", "onnxruntime"; by
        default it follows the object or the file (its content, not its suffix). `backend_options`
        go to the ONNX Runtime backend (`providers`, `session_options`, `outputs`: see
        `soagen.runtime.onnx.OnnxBackend`). `protect_inputs=True` runs the model on copies of the input collections,
        for models that write into their inputs. Each integer input the schema declares with
        `indexes NAME` has its values checked to lie in `[0, n)`, n the element count of input
        NAME, before each call, because an out-of-range index inside compiled kernels aborts the
        process or reads out of bounds instead of raising. On CPU a bad index raises
        `IndexRangeError`. On a GPU the check is queued on the stream, with no host wait: a bad
        index is a device-side assert (torch's CUDA assert does not print the message), and that
        GPU's CUDA context is unusable afterwards; `Model.remote` and `soagen serve` check on the
        host instead. `index_bounds` adds bounds or replaces them
        (`{"edge_index": "node_features"}`), or turns one off (`{"edge_index": None}`); `.pt2`
        packages bring the bounds they were compiled with. `contiguous` names inputs to hand over,
        besides those the schema declares `contiguous`, as one device-local contiguous copy per
        call instead of the strided view: for models whose own operations on the column-major
        `[n, c]` view (a `torch.cat` with row-major tensors, row gathers) cost more than the copy.
        With backend="compile", every call that compiles a graph also runs the eager model on
        the same inputs and raises `CompiledModelMismatchError` if they disagree;
        `fallback_to_eager=True` warns once instead and runs that device eagerly from then on.
        `graphs=True` captures each call on CUDA collections into a CUDA graph at its first call
        on that memory and replays it at later ones (`soagen.runtime.graphs`: what is captured,
        the key, the checks); at most `graph_cache_size` graphs are kept (default 8), the least
        recently used dropped first. Calls on CPU collections run as usual.
        """
        from soagen.runtime.backends import load_backend

        for spec in type(self).OUTPUTS:
            # A scalar is one value per collection, seen with stride 0 along n: it cannot take one
            # output value per element (the schema checker refuses such schemas with SOA309; this
            # guards hand-made specs).
            if 0 in spec.block.view(2).strides:
                raise BindingError(
                    f"{type(self).NAME}: output {spec.name!r} binds scalars of "
                    f"{spec.block.layout}; an output block must hold columns"
                )
        self._backend: Backend = load_backend(
            model,
            kind=backend,
            binding=type(self),
            fallback_to_eager=fallback_to_eager,
            options=backend_options,
        )
        self.protect_inputs = protect_inputs
        if self._backend.writes_inputs and not protect_inputs:
            raise InputModifiedError(
                f"{type(self).NAME}: {self._backend.description} writes into its input(s) "
                f"{', '.join(repr(name) for name in self._backend.writes_inputs)}, which would "
                f"change the caller's collections without a trace; load it with "
                f"protect_inputs=True to run it on copies"
            )
        bounds: dict[str, str | None] = dict(declared_index_bounds(type(self).INPUTS))
        bounds.update(self._backend.index_bounds)
        bounds.update(index_bounds or {})
        # Read-only: call plans hold the checks these bounds ask for.
        self.index_bounds: Mapping[str, str] = types.MappingProxyType(
            _checked_bounds(type(self), bounds)
        )
        # Those the model checks itself (`Backend.index_ranges_checked`) run here only after it
        # refused a call, to name the values; the others run before each call.
        in_model = self._backend.index_ranges_checked
        self._index_checked_in_model = frozenset(
            name for name, bound in self.index_bounds.items() if in_model.get(name) == bound
        )
        # Inputs holding indices, checked or not, with the input they index: their values count
        # from the start of that input's whole collection, so a `batch_size` call cannot slice it.
        indexed = {**declared_index_bounds(type(self).INPUTS), **self.index_bounds}
        whole = {spec.name for spec in type(self).INPUTS if spec.whole}
        self._whole_inputs = frozenset(whole)
        self._sliced_index_targets = sorted(
            (name, target) for name, target in indexed.items() if target not in whole
        )
        self._same_n = [
            (spec.name, spec.same_n_as) for spec in type(self).INPUTS if spec.same_n_as is not None
        ]
        inputs = [spec.name for spec in type(self).INPUTS]
        self._input_position = {name: position for position, name in enumerate(inputs)}
        self._input_names = tuple(inputs)
        self._output_names = tuple(spec.name for spec in type(self).OUTPUTS)
        self._binding_names = (*inputs, *self._output_names)
        # (binding name, block spec) pairs, read on every call.
        self._input_blocks = [(spec.name, spec.block) for spec in type(self).INPUTS]
        self._output_blocks = [(spec.name, spec.block) for spec in type(self).OUTPUTS]
        self._checked_classes: set[tuple[type, ...]] = set()
        # Call plans by the identities of a call's collections, inputs then outputs, in schema
        # order (see `_CallPlan`); a plan leaves when one of its collections is collected, so an id
        # found here is still that collection's. Bindings that run their model elsewhere (remote
        # ones override `_execute`) make none.
        self._plans: dict[tuple[int, ...], _CallPlan] = {}
        self._plans_lock = threading.Lock()
        # Collections called once, held weakly: a plan is made at their second call, so that
        # events that each bring new collection objects do not pay for plans never used again.
        self._called_once: dict[tuple[int, ...], tuple[weakref.ref[Collection], ...]] = {}
        self._makes_plans = (
            type(self)._execute is ModelBinding._execute
            and type(self)._evaluate is ModelBinding._evaluate
            and type(self)._run_once is ModelBinding._run_once
        )
        # A package that writes its outputs must not be handed an output over memory it reads.
        self._shared_members = shared_members(type(self))
        declared = frozenset(spec.name for spec in type(self).INPUTS if spec.contiguous)
        self._contiguous = declared | frozenset(contiguous)
        for name in sorted(self.contiguous - set(inputs)):
            raise BindingError(
                f"contiguous: {type(self).NAME} has no input {name!r}; its inputs are "
                f"{', '.join(inputs)}"
            )
        added = sorted(self.contiguous - declared)
        if added and self._backend.kind == "aot":
            # `soagen compile` exports the schema's `contiguous` inputs as copies, the rest as views.
            raise BindingError(
                f"contiguous: {self._backend.description} was compiled for the collections' "
                f"strided views of {', '.join(repr(name) for name in added)} and reads them in "
                f"place; a contiguous copy has other strides, which it does not take. Leave "
                f"contiguous= out, or declare `contiguous` in the schema and compile again"
            )
        self._run_settings = self._settings_of_runs()
        if graphs or graph_cache_size is not None:
            from soagen.runtime.graphs import call_graphs

            self._graphs = call_graphs(self, graphs, graph_cache_size)

    @classmethod
    def load(
        cls: type[_M],
        path: str | os.PathLike[str],
        *,
        backend: str | None = None,
        protect_inputs: bool = False,
        index_bounds: Mapping[str, str | None] | None = None,
        contiguous: Iterable[str] = (),
        backend_options: Mapping[str, object] | None = None,
        graphs: bool = False,
        graph_cache_size: int | None = None,
    ) -> _M:
        """Load a model file: TorchScript (`.pt`), an AOTInductor package (`.pt2`) built by
        `soagen compile`, which is refused if it was built for another schema or layout, or an
        ONNX model (`.onnx`), whose inputs and outputs are checked against the schema's.
        `graphs`, `graph_cache_size`: CUDA graphs, as for the constructor."""
        return cls(
            path,
            backend=backend,
            protect_inputs=protect_inputs,
            index_bounds=index_bounds,
            contiguous=contiguous,
            backend_options=backend_options,
            graphs=graphs,
            graph_cache_size=graph_cache_size,
        )

    @classmethod
    def remote(
        cls: type[_M],
        url: str | Sequence[str],
        *,
        model_name: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        fallback: object | None = None,
        shared_memory: bool | None = None,
        access_token: str | Mapping[str, str] | None = None,
        probe_interval: float = 1.0,
        index_bounds: Mapping[str, str | None] | None = None,
    ) -> _M:
        """The model served by a Triton server at `url` ("host:port" of its gRPC endpoint, such as
        `soagen serve` starts), called exactly as a local one: `model(nodes, edges, out=scores)`.
        `url` may be a list of such servers (each once): each request goes to the one with the
        fewest requests outstanding (ties in turn).

        `model_name`: the name it is served under (default: this binding's). `timeout`: seconds
        each attempt may take; `retries`: attempts after the first when the server is unreachable
        or too slow (with several servers: rounds over them). A server that fails so is taken out
        of rotation, the request goes on to the others, and the server is probed for readiness
        `probe_interval` seconds later (the wait doubling after each failed probe, up to 8 times
        that), then used again. `fallback`: a local model (anything this class takes, or an
        instance of it) to run instead when every attempt failed; without one such calls raise
        `RemoteUnavailableError`, naming each server and what it failed with. `shared_memory`:
        send blocks through system shared memory (None: to each server on a loopback address that
        accepts it). `access_token`: the servers' token for registering shared memory and reading
        statistics (`soagen serve --token-file`), or a mapping of URL to token. `index_bounds`:
        the index checks made here before sending, as for a local model (the schema's `indexes`
        clauses by default). Outputs are written only after the whole response of one server is
        checked; errors a server answers with are raised, not sent elsewhere. Needs
        `tritonclient[grpc]` (`soagen[serve]`).
        """
        from soagen.serving.client import remote_binding

        return remote_binding(
            cls,
            url,
            model_name=model_name,
            timeout=timeout,
            retries=retries,
            fallback=fallback,
            shared_memory=shared_memory,
            access_token=access_token,
            probe_interval=probe_interval,
            index_bounds=index_bounds,
        )

    @property
    def contiguous(self) -> frozenset[str]:
        """Inputs handed over as one contiguous copy per call (the schema's `contiguous` and the
        constructor's), fixed for the binding's life: call plans and runs are made with them."""
        return self._contiguous

    @property
    def backend(self) -> str:
        return self._backend.kind

    @property
    def compiled_graphs(self) -> tuple[CompiledGraph, ...]:
        """With backend="compile": each compile this model's calls started (the device, how many
        graphs, the inputs' shapes and strides at that call, and torch's reasons why the graphs
        before did not serve it); empty for other backends."""
        from soagen.runtime.backends import CompileBackend

        return self._backend.graphs if isinstance(self._backend, CompileBackend) else ()

    def __repr__(self) -> str:
        placed = ", ".join(str(device) for device in self._backend.devices) or "nowhere yet"
        compiled = ""
        if self._backend.kind == "compile":
            compiled = f"; {sum(graph.graphs for graph in self.compiled_graphs)} graph(s) compiled"
        return (
            f"<{type(self).NAME} {self._backend.kind}: {self._backend.description}; "
            f"placed on {placed}{compiled}>"
        )

    def close(self) -> None:
        """Release the runners placed on the devices the model ran on (its copies on GPUs,
        TorchScript modules and AOTInductor packages loaded there); a later call places it again.
        `torch.compile`'s code stays in torch's own cache. A remote binding closes its connection
        for good. A binding made with graphs=True drops its CUDA graphs. `with Model(...) as
        model:` closes it at the end of the block."""
        with self._plans_lock:
            self._plans.clear()  # they hold the runners
        if self._graphs is not None:
            self._graphs.clear()
        self._backend.release()

    def __enter__(self: _M) -> _M:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @classmethod
    def binding(cls, name: str) -> BindingSpec:
        for spec in (*cls.INPUTS, *cls.OUTPUTS):
            if spec.name == name:
                return spec
        known = ", ".join(spec.name for spec in (*cls.INPUTS, *cls.OUTPUTS))
        raise KeyError(f"{cls.NAME} has no binding {name!r}; its bindings are {known}")

    def _unpack_out(self, out: object, layouts: tuple[str, ...]) -> tuple[Collection, ...]:
        """`out=` of a model whose outputs lie in several layouts: one collection per layout, in
        schema order (their layouts are checked with the rest of the call)."""
        if isinstance(out, tuple | list) and len(out) == len(layouts):
            return tuple(out)
        got = (
            f"({', '.join(_described(item) for item in out)})"
            if isinstance(out, tuple | list)
            else _described(out)
        )
        raise BindingError(
            f"{type(self).NAME} takes out=({', '.join(layouts)}): one collection per output "
            f"layout, in that order; got {got}"
        )

    def _call_in_schema_order(
        self,
        collections: tuple[Collection, ...],
        stream: object | None,
        batch_size: int | None,
    ) -> None:
        """The generated `__call__`: one collection per binding, inputs then outputs in schema
        order. A call with the collections of a plan runs it straight away: the plan's
        collections are these very objects (it leaves when one of them is collected), in this
        order, all checked when it was made."""
        # `_plan_key`, written out: this is every generated call's path.
        key = None
        if stream is None and batch_size is None and not self.protect_inputs:
            key = tuple(map(id, collections))
            plan = self._plans.get(key)
            if plan is not None:
                call = plan.call
                if call is None:
                    self._run_plan(plan, collections)
                    return
                # `_run_plan`'s first case, without its frame.
                try:
                    call()
                except BaseException as error:
                    self._failed_plan(plan, error)
                    raise
                return
        self._call_without_plan(collections, stream, batch_size, key)

    def _call_without_plan(
        self,
        collections: tuple[Collection, ...],
        stream: object | None,
        batch_size: int | None,
        key: tuple[int, ...] | None,
    ) -> None:
        """The generated call whose collections have no plan (`key`: their plans' key, None for
        a call that runs none): checked, and planned at its second call."""
        first_output = len(self._input_names)
        self._run_checked(
            dict(zip(self._input_names, collections[:first_output], strict=True)),
            dict(zip(self._output_names, collections[first_output:], strict=True)),
            collections,
            key,
            stream,
            batch_size,
        )

    def _plan_key(
        self, collections: tuple[Collection, ...], stream: object | None, batch_size: int | None
    ) -> tuple[int, ...] | None:
        """The collections' ids, for a call that may run a plan (none with a stream, a batch
        size or protected inputs), else None."""
        if stream is None and batch_size is None and not self.protect_inputs:
            return tuple(map(id, collections))
        return None

    def run(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        *,
        stream: object | None = None,
        batch_size: int | None = None,
    ) -> None:
        """Run with collections given per binding name; the generated `__call__` calls this.

        `stream`: a CUDA stream of the collections' GPU to run on instead of the caller's current
        one. As with `torch.cuda.stream`, it does not wait for work queued on other streams: when
        the inputs were written on another one, call `stream.wait_stream(that_stream)` first.
        `batch_size`: run in
        slices of at most this many elements (rounded up so every slice starts aligned), as
        CMSSW's BatchedTensorCollection does: every collection is sliced alike (so all must have
        the same size) except those of inputs the schema declares `whole`, which each slice gets
        entire. An index input may index only `whole` inputs then: its values count elements of the
        entire collection. With more than one slice, the results are held
        in a scratch copy of each output collection and written into `outputs` once every slice
        has run, so a failing slice writes nothing.
        """
        collections = (*inputs.values(), *outputs.values())
        key = self._plan_key(collections, stream, batch_size)
        if key is not None:
            plan = self._plans.get(key)
            if plan is not None and (*inputs, *outputs) == self._binding_names:
                self._run_plan(plan, collections)
                return
        self._run_checked(inputs, outputs, collections, key, stream, batch_size)

    def _run_checked(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        collections: tuple[Collection, ...],
        key: tuple[int, ...] | None,
        stream: object | None,
        batch_size: int | None,
    ) -> None:
        """`run` past its plan lookup, which found none: every check, then the call (and a plan
        for these collections when they come again). `collections`: inputs then outputs, in the
        mappings' order; `key`, their ids, or None where no plan may run."""
        cls = type(self)
        # Names and layouts depend only on the mapping's keys and the collections' classes:
        # check each combination once (the generated `__call__` always passes the same keys).
        classes = tuple(map(type, collections))
        in_order = (*inputs, *outputs) == self._binding_names
        if not in_order or classes not in self._checked_classes:
            _check_names(cls, cls.INPUTS, inputs, "input")
            _check_names(cls, cls.OUTPUTS, outputs, "output")
            if in_order:
                self._checked_classes.add(classes)
        # The collections' fields, not their properties: this runs for every new event's
        # collections, where each property's frame counts.
        device = collections[0]._device
        for collection in collections:
            if collection._device != device:
                raise BindingError(
                    f"{cls.NAME}: all collections must be on one device, but {collection.NAME} is "
                    f"on {collection.device} and {collections[0].NAME} on {device}"
                )
        for name, collection in outputs.items():
            if collection._memory.read_only:
                raise ReadOnlyCollectionError(
                    f"{cls.NAME}: output {name!r} is a {collection.NAME} wrapped read-only "
                    f"(read_only=True), and the model's results would be written into it; give "
                    f"it a writable collection"
                )
        for name, other in self._same_n:
            if inputs[name]._size != inputs[other]._size:
                raise BindingError(
                    f"{cls.NAME}: input {name!r} ({inputs[name].NAME}, n={inputs[name].size}) "
                    f"must hold as many elements as input {other!r} ({inputs[other].NAME}, "
                    f"n={inputs[other].size}): the schema declares `same n as {other}`; the "
                    f"model was not run"
                )
        if not _cpu_settled and device.type == "cpu":
            _settle_cpu()
        graphs = self._graphs
        if graphs is not None and device.type != graphs.device_type:
            graphs = None  # graphs=True, but these collections are where none is captured
        # The second call with these very collections makes their plan, which the next ones run,
        # skipping every check above; with graphs, the plan looks their graph up.
        if self._makes_plans and in_order and key is not None:
            if self._called_before(key, collections):
                plan = (
                    self._plan(key, collections, inputs, outputs, device)
                    if graphs is None
                    else self._graph_plan(key, collections, outputs, device)
                )
                self._run_plan(plan, collections)
                return
        if graphs is not None:
            # graphs=True: this call is replayed from, or captured into, a CUDA graph.
            graphs.call(inputs, outputs, device, stream, batch_size)
            return
        if stream is None and batch_size is None:
            self._run_once(inputs, outputs, device)  # the common call, without a context manager
            return
        if batch_size is not None and len(self._whole_inputs) == len(cls.INPUTS):
            raise BindingError(
                f"batch_size: every input of {cls.NAME} is declared `whole`, so each slice would "
                f"get the same inputs and compute all its elements again; run it without "
                f"batch_size"
            )
        if batch_size is not None and self._sliced_index_targets:
            # Refused whatever the event's size, not only once it needs more than one slice.
            pairs = ", ".join(
                f"{name!r} indexes {target!r}" for name, target in self._sliced_index_targets
            )
            raise BindingError(
                f"batch_size: in {cls.NAME}, {pairs}: those values count elements of the whole "
                f"collection, and batch_size would slice it, so they would point at the wrong "
                f"elements. Declare the indexed input(s) `whole` in the schema (each slice then "
                f"gets them entire), or run without batch_size"
            )
        with _on_stream(stream, device):
            if batch_size is None:
                self._run_once(inputs, outputs, device)
                return
            slices = list(_batches(cls, inputs, outputs, batch_size, self._whole_inputs))
            if len(slices) <= 1:
                self._run_once(inputs, outputs, device)
                return
            # Slices write into scratch collections, and the output blocks take their results once
            # every slice has run: a slice that fails leaves the outputs as they were.
            scratch = {id(c): type(c).allocate(c.size, device) for c in outputs.values()}
            staged = {name: scratch[id(c)] for name, c in outputs.items()}
            for start, stop in slices:
                self._run_once(
                    {
                        name: c if name in self._whole_inputs else c.slice(start, stop)
                        for name, c in inputs.items()
                    },
                    {name: c.slice(start, stop) for name, c in staged.items()},
                    device,
                )
            for name, block in self._output_blocks:
                outputs[name].block(block).copy_(staged[name].block(block))

    def _called_before(self, key: tuple[int, ...], collections: tuple[Collection, ...]) -> bool:
        """Whether these very collections (not others that took their ids, `key`) were called
        with before; remembers them if not."""
        seen = self._called_once.get(key)
        if seen is not None and all(
            ref() is collection for ref, collection in zip(seen, collections, strict=True)
        ):
            return True
        if len(self._called_once) >= 2 * _PLANS_PER_BINDING:
            self._called_once.clear()  # a few events' worth: what a plan would serve is recent
        self._called_once[key] = tuple(map(weakref.ref, collections))
        return False

    def _plan(
        self,
        key: tuple[int, ...],
        collections: tuple[Collection, ...],
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
    ) -> _CallPlan:
        """The call plan for these collections (inputs then outputs, in schema order, all checked
        by `run`; `key`, their ids): kept while every one of them lives, at most
        `_PLANS_PER_BINDING`."""
        import torch

        self._check_overlaps(inputs, outputs)
        targets = None
        if _any_elements(outputs):
            targets = [outputs[name].block(block) for name, block in self._output_blocks]
        views = self._input_views(inputs)
        checks: list[_IndexCheck] = []
        model_checks: list[_IndexCheck] = []
        for index_name, bound_name in self.index_bounds.items():
            check = (self._input_position[index_name], index_name, bound_name)
            (model_checks if index_name in self._index_checked_in_model else checks).append(
                (*check, inputs[bound_name].size)
            )
        # Not placed for a call with nothing to compute: it never reaches the model. The model's
        # arguments are these views (and output blocks) at every call, but for contiguous copies,
        # made anew per call: a backend may check them once now.
        backend = self._backend
        in_inference_mode = (
            torch.is_inference_mode_enabled() if backend.moves_version_counters else None
        )
        model_call = None
        call: typing.Callable[[], object] | None = _nothing
        if targets is not None:
            copies = bool(self.contiguous) and not backend.adapts_inputs
            arguments = [*views, *targets] if backend.writes_outputs else views
            runner = backend.on(device) if copies else backend.on_fixed_inputs(device, arguments)
            model_call = self._model_call(runner, targets, repeated=True)
            call = None
            # One call where nothing is left per call but the run and index checks on the host:
            # views made inside inference mode and checks on a GPU are `_run_plan`'s.
            run = (
                functools.partial(runner, arguments)
                if backend.writes_outputs
                and not copies
                and not backend.moves_version_counters
                and not backend.records_autograd
                else functools.partial(model_call, views)
            )
            index_checked = (_buffers or _load_buffers())._IndexCheckedCall
            if not checks and not in_inference_mode:
                call = run
            elif (
                not in_inference_mode
                and index_checked is not None
                and all(views[check[0]].is_cpu for check in checks)
            ):
                call = index_checked(
                    tuple((views[position], size) for position, _, _, size in checks),
                    run,
                    # The class, not the binding: the plan it belongs to is the binding's.
                    functools.partial(_check_planned_index, type(self), views, tuple(checks)),
                    _COMPILED_EXTREMES_MAX,
                )
        plan = _CallPlan(
            key=key,
            collections=self._plan_references(key, collections),
            views=views,
            in_inference_mode=in_inference_mode,
            index_checks=tuple(checks),
            model_index_checks=tuple(model_checks),
            model_call=model_call,
            call=call,
        )
        return self._keep_plan(plan)

    def _graph_plan(
        self,
        key: tuple[int, ...],
        collections: tuple[Collection, ...],
        outputs: Mapping[str, Collection],
        device: torch.device,
    ) -> _CallPlan:
        """The call plan of a binding made with graphs=True, for collections on its graphs' device
        (as `_plan` takes them): a lookup of their graph and its replay."""
        graphs = typing.cast("CallGraphs", self._graphs)
        references = self._plan_references(key, collections)
        return self._keep_plan(
            _CallPlan(
                key=key,
                collections=references,
                views=[],
                in_inference_mode=None,
                index_checks=(),
                model_index_checks=(),
                model_call=None,
                # A call with nothing to compute never reaches a graph.
                call=graphs.planned_call(references, device)
                if _any_elements(outputs)
                else _nothing,
            )
        )

    def _plan_references(
        self, key: tuple[int, ...], collections: tuple[Collection, ...]
    ) -> tuple[weakref.ref[Collection], ...]:
        """Weak references to a plan's collections, the first of them collected dropping it."""
        plans = self._plans

        def forget(_: object) -> None:
            plans.pop(key, None)

        return tuple(weakref.ref(collection, forget) for collection in collections)

    def _keep_plan(self, plan: _CallPlan) -> _CallPlan:
        """Keep `plan`, at most `_PLANS_PER_BINDING` in all."""
        plans = self._plans
        with self._plans_lock:
            if len(plans) >= _PLANS_PER_BINDING:
                # The oldest; a collector run may drop plans meanwhile (`forget`).
                with contextlib.suppress(RuntimeError, StopIteration):
                    plans.pop(next(iter(plans)), None)
            plans[plan.key] = plan
        return plan

    def _run_plan(self, plan: _CallPlan, collections: tuple[Collection, ...]) -> None:
        """A call whose checks its plan made: views, index ranges, the model, the write-back;
        `collections`, the plan's, inputs then outputs in schema order."""
        try:
            call = plan.call
            if call is not None:
                call()
                return
            views = plan.views
            if plan.in_inference_mode and not (_torch or _load_torch()).is_inference_mode_enabled():
                # Views made inside inference mode share their buffer's version counter, and
                # those made outside it have their own (`Collection._block_with_own_version`): a
                # call outside it gets its own, as a call without a plan would. (Views with their
                # own serve a call inside it as well: the model runs in inference mode either way.)
                inputs = collections[: len(self._input_names)]
                views = self._input_views(dict(zip(self._input_names, inputs, strict=True)))
            for position, index_name, bound_name, size in plan.index_checks:
                _check_index_range(type(self), index_name, views[position], bound_name, size)
            typing.cast(_ModelCall, plan.model_call)(views)
        except BaseException as error:
            self._failed_plan(plan, error)
            raise

    def _failed_plan(self, plan: _CallPlan, error: BaseException) -> None:
        """Drop a plan whose call failed, and raise `IndexRangeError` naming the values where
        the model refused an index its plan left it to check."""
        # The views may be what failed: a model that wrote into an input, or changed its shape in
        # place (which moves its version counter too), has them as it left them.
        self._plans.pop(plan.key, None)
        if isinstance(error, RuntimeError):
            for position, index_name, bound_name, size in plan.model_index_checks:
                _check_index_range(type(self), index_name, plan.views[position], bound_name, size)

    def _run_once(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
    ) -> None:
        if _any_elements(outputs):
            targets = [outputs[name].block(block) for name, block in self._output_blocks]
            self._execute(inputs, outputs, device, targets)

    def _execute(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
        targets: Sequence[torch.Tensor],
    ) -> None:
        """Run the model and write its outputs into `targets`, the output blocks (a remote binding
        runs it on its server instead)."""
        if self._shared_members:
            self._check_overlaps(inputs, outputs)
        self._evaluate(inputs, device, targets)

    def _check_overlaps(
        self, inputs: Mapping[str, Collection], outputs: Mapping[str, Collection]
    ) -> None:
        """Refuse output blocks over memory the model still reads, for backends that write
        outputs while they run."""
        if (
            self._backend.writes_outputs
            and not self._backend.outputs_may_overlap_inputs
            and not self.protect_inputs
        ):
            cls = type(self)
            for i, o in self._shared_members:
                source, target = cls.INPUTS[i].name, cls.OUTPUTS[o].name
                if _share_elements(inputs[source], outputs[target]):
                    raise BindingError(
                        f"{cls.NAME}: output {target!r} lies in the memory of input {source!r}, "
                        f"and {self._backend.description} writes its outputs while it still "
                        f"reads its inputs; give the output its own collection, or "
                        + (
                            "load it with backend_options={'outputs': 'staged'}"
                            if self._backend.kind == "onnxruntime"
                            else "use a package built without --write-outputs"
                        )
                    )

    def _check_index_ranges(
        self,
        inputs: Mapping[str, Collection],
        views: Sequence[torch.Tensor],
        *,
        on_host: bool = False,
        skip: frozenset[str] = frozenset(),
    ) -> None:
        """The `index_bounds` checks, on the input views in schema order, but for the index
        inputs in `skip`; `on_host`: raise `IndexRangeError` for device data too (see
        `_check_index_range`)."""
        for index_name, bound_name in self.index_bounds.items():
            if index_name in skip:
                continue
            indices = views[self._input_position[index_name]]
            size = inputs[bound_name].size
            _check_index_range(type(self), index_name, indices, bound_name, size, on_host=on_host)

    def _evaluate(
        self,
        inputs: Mapping[str, Collection],
        device: torch.device,
        targets: Sequence[torch.Tensor] | None,
    ) -> list[torch.Tensor]:
        """Run the model on the input blocks and return its outputs in schema order. With `targets`
        (the output blocks) every output is checked against its block, then all are written; with
        None nothing is checked against blocks or written: `soagen serve` sends them to a client,
        which checks them against its own output blocks. A package built with --write-outputs
        writes into `targets` itself (its argument check covers them) and needs them."""
        sources = inputs
        if self.protect_inputs:
            # One buffer copy per collection keeps the views' strides, which AOT packages rely on.
            copies = {id(c): c.clone() for c in inputs.values()}
            sources = {name: copies[id(c)] for name, c in inputs.items()}
        views = self._input_views(sources)
        in_model = self._index_checked_in_model
        if len(self.index_bounds) > len(in_model):
            self._check_index_ranges(sources, views, skip=in_model)
        model_call = self._model_call(self._backend.on(device), targets, repeated=False)
        try:
            return model_call(views)
        except RuntimeError:
            if in_model:
                self._check_index_ranges(sources, views)  # raises, naming the values it refused
            raise

    def _input_views(self, inputs: Mapping[str, Collection]) -> list[torch.Tensor]:
        """The views handed to the model, in schema order. Where the backend moves version
        counters, each has its own: a write is pinned on the input that took it, and writes by
        other threads elsewhere in these buffers do not look like the model's."""
        if not self._backend.moves_version_counters:
            return [inputs[name].block(block) for name, block in self._input_blocks]
        return [inputs[name]._block_with_own_version(block) for name, block in self._input_blocks]

    def _model_call(
        self, runner: Runner, targets: Sequence[torch.Tensor] | None, *, repeated: bool
    ) -> _ModelCall:
        """The model's run on the input views (checked), as one function: contiguous copies where
        asked, the model, its return value and its inputs' version counters checked, then each
        output checked against its block in `targets` (the output blocks) and, once all fit,
        written there. With `targets` None nothing is checked against blocks or written:
        `soagen serve` sends the results to a client, which checks them against its own blocks.
        A package built with --write-outputs writes into `targets` itself (its argument check
        covers them) and needs them. A call plan makes it once (`repeated`), so that its calls
        read nothing of the binding or its backend, and writes through writers made for its
        blocks (`block_writer`); a call without a plan, through `copy_values` (through
        `block_writer` where a block holds `_STRIDED_COPY_MIN` values or more)."""
        cls, watched, copied, writes_outputs, guard, single_output = self._run_settings
        if writes_outputs and targets is None:
            raise BindingError(
                f"{cls.NAME}: {self._backend.description} writes its results into output "
                f"blocks, and this call has none: give it output collections (`out=`, or "
                f"`run(inputs, outputs)`)"
            )
        protect_inputs = self.protect_inputs
        tensor_type = (_torch or _load_torch()).Tensor
        signatures = list(map(_SIGNATURE, targets or ()))
        buffers = _buffers or _load_buffers()
        # Empty where nothing is written here (no output blocks, or a package that writes them).
        # A single call makes a compiled writer only where its copy outweighs reading the block's
        # geometry (a new event's collections come with every call).
        writers = [
            buffers.block_writer(target)
            if repeated or target.numel() >= buffers._STRIDED_COPY_MIN
            else functools.partial(buffers.copy_values, target)
            for target in (() if writes_outputs else targets or ())
        ]

        def finish(
            views: Sequence[torch.Tensor], versions: list[int] | None, result: object
        ) -> list[torch.Tensor]:
            """Everything after the run: `versions`, the views' counters before it (None where
            not watched); `result`, the model's return value (None for a package that wrote)."""
            if writes_outputs:
                results = list(typing.cast(Sequence["torch.Tensor"], targets))
            # `outputs_in_schema_order`'s first case, without its frame.
            elif single_output and isinstance(result, tensor_type):
                results = [result]
            else:
                results = outputs_in_schema_order(cls, result)
            if versions is not None and list(map(_VERSION, views)) != versions:
                _check_versions(cls, protect_inputs, views, versions)
            if targets is not None and not writes_outputs:
                if list(map(_SIGNATURE, results)) != signatures:
                    _check_outputs(cls, results, targets)  # raises, naming the output
                # One writer per result (their count is checked): zip's `strict=` alone costs a
                # keyword parse.
                for position, write in enumerate(writers):
                    write(results[position])
            return results

        if (
            buffers._ModelRun is not None
            and targets is not None
            and not writes_outputs
            and copied is None
        ):
            # `finish` for the calls that go otherwise; those that go as they should, without
            # the Python frames (`soagen/runtime/_compiled.c`), planned or not. It takes the
            # views as a list, as plans hold them and `_input_views` makes them.
            # Annotated, not `typing.cast`: a call of its own on every call without a plan.
            compiled: _ModelCall = buffers._ModelRun(
                runner, guard, _SIGNATURE, tuple(signatures), tuple(writers), finish, watched
            )
            return compiled

        def model_call(views: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            versions = list(map(_VERSION, views)) if watched else None
            arguments = views
            if copied is not None:
                arguments = [
                    buffers.contiguous_copy(view) if copy_it else view
                    for copy_it, view in zip(copied, views, strict=True)
                ]
            result = None
            if writes_outputs:
                # The package checks the output blocks' geometry with the inputs' and writes them.
                runner([*arguments, *typing.cast(Sequence["torch.Tensor"], targets)])
            elif guard is None:
                result = runner(arguments)
            else:
                with guard(True):
                    result = runner(arguments)
            return finish(views, versions, result)

        return model_call

    def _settings_of_runs(self) -> _RunSettings:
        """What `_model_call` needs of the binding and its backend, which neither changes."""
        cls = type(self)
        backend = self._backend
        torch_module = _torch or _load_torch()
        copied = None
        if self.contiguous and not backend.adapts_inputs:
            copied = tuple(spec.name in self.contiguous for spec in cls.INPUTS)
        return (
            cls,
            backend.moves_version_counters,
            copied,
            backend.writes_outputs,
            # The guard `torch.inference_mode()` enters, without its Python wrapper, whose
            # frames cost more than the guard once a large model has pushed this code out of the
            # caches.
            torch_module._C._InferenceMode if backend.records_autograd else None,
            len(cls.OUTPUTS) == 1,
        )


def _compile_call_in_schema_order() -> None:
    """The generated call's path through the call plans without a Python frame
    (`soagen/runtime/_compiled.c`), where the install built it: a method in C that makes the
    planned calls and hands every other to the Python method it replaces."""
    try:
        from soagen.runtime._compiled import PlannedCall
    except ImportError:
        return
    python_method = ModelBinding.__dict__["_call_in_schema_order"]
    ModelBinding._call_in_schema_order = PlannedCall(python_method)  # type: ignore[method-assign,assignment]


_compile_call_in_schema_order()


# What `ModelBinding._model_call` needs of a binding: its class; whether its backend moves version counters;
# which inputs it hands over as contiguous copies (None: none); whether the backend writes its
# outputs; the inference-mode guard to run the model in (None: none); whether it has one output.
_RunSettings = tuple[
    type["ModelBinding"],
    bool,
    "tuple[bool, ...] | None",
    bool,
    "typing.Callable[[bool], typing.ContextManager[None]] | None",
    bool,
]


def _nothing() -> None:
    """The call of a plan whose outputs are all empty: nothing to compute."""


def _check_versions(
    cls: type[ModelBinding],
    protect_inputs: bool,
    views: Sequence[torch.Tensor],
    versions: Sequence[int],
) -> None:
    """Refuse a model that wrote into an input view (its version counter moved)."""
    if [view._version for view in views] != versions and not protect_inputs:
        # Each view has its own counter (`Collection._block_with_own_version`), except inside
        # a caller's `torch.inference_mode()`, where views of one buffer share the buffer's:
        # then every input bound to the written collection moved, and which one took the
        # write is unknown.
        moved = [
            spec
            for spec, view, version in zip(cls.INPUTS, views, versions, strict=True)
            if view._version != version
        ]
        blocks = ", ".join(
            f"{spec.name!r} ({spec.block.layout}{{{', '.join(spec.block.members)}}})"
            for spec in moved
        )
        if len(moved) == 1:
            which = f"its input {blocks}"
        elif all(view._base is None for view in views):  # counters of their own
            which = f"its inputs {blocks}"
        else:
            which = f"one of its inputs {blocks} (views of one buffer share a version counter)"
        raise InputModifiedError(
            f"{cls.NAME} wrote into {which}; that collection now holds modified data. "
            f"Fix the model, or create the binding with protect_inputs=True to run it on copies"
        )


def _any_elements(outputs: Mapping[str, Collection]) -> bool:
    """Whether a call's outputs hold any element: with every one empty there is nothing to
    compute, which also spares backends their n < 2 corner cases. (Sizes, not the blocks'
    numel(): every torch call here costs microseconds once the model has pushed this code out of
    the caches.)"""
    for collection in outputs.values():
        if collection._size:
            return True
    return False


# C-level getters for the per-call checks: a comprehension is a function call of its own.
_VERSION = operator.attrgetter("_version")
_SIGNATURE = operator.attrgetter("shape", "dtype", "device")


# The torch module, bound at the first call that needs it: this module imports without torch, and
# an `import torch` statement in a function costs about 1k instructions at every call.
_torch: types.ModuleType | None = None


def _load_torch() -> types.ModuleType:
    global _torch
    import torch

    _torch = torch
    return torch


# `soagen.runtime.buffers`, once imported (it imports torch).
_buffers: types.ModuleType | None = None


def _load_buffers() -> types.ModuleType:
    global _buffers
    from soagen.runtime import buffers

    _buffers = buffers
    return buffers


def _described(collection: object) -> str:
    return str(getattr(collection, "NAME", type(collection).__name__))


def _check_names(
    cls: type[ModelBinding],
    specs: tuple[BindingSpec, ...],
    given: Mapping[str, Collection],
    role: str,
) -> None:
    expected = [spec.name for spec in specs]
    if len(given) != len(expected) or any(name not in given for name in expected):
        raise BindingError(
            f"{cls.NAME} has {role}s {', '.join(expected)}; got {', '.join(given) or 'none'}"
        )
    for spec in specs:
        collection = given[spec.name]
        if getattr(collection, "NAME", None) != spec.block.layout:
            argument = " (out=)" if role == "output" else ""
            raise BindingError(
                f"{cls.NAME}.{spec.name}{argument} binds {spec.block.layout}, got "
                f"{_described(collection)}"
            )
        key, found = spec.block.layout_key, getattr(collection, "LAYOUT_KEY", "")
        # An empty key on either side (hand-made specs or classes) checks nothing.
        if key and found and found != key:
            members = ", ".join(
                f"{member.name}: {member.dtype}" for member in getattr(collection, "MEMBERS", ())
            )
            raise BindingError(
                f"{cls.NAME}.{spec.name} binds {spec.block.layout} as {cls.SCHEMA} declares or "
                f"imports it, got a different layout of that name from "
                f"{getattr(collection, 'SCHEMA', '?')} "
                f"(align {getattr(collection, 'ALIGNMENT', '?')}: {members}); its bytes would be "
                f"misread. Generate both from one schema"
            )


def _checked_bounds(cls: type[ModelBinding], bounds: Mapping[str, str | None]) -> dict[str, str]:
    """The bounds to check, every name verified; None turns a bound off."""
    inputs = {spec.name: spec for spec in cls.INPUTS}
    for index_name, bound_name in bounds.items():
        for name in (index_name, bound_name):
            if name is not None and name not in inputs:
                raise BindingError(
                    f"index_bounds: {cls.NAME} has no input {name!r}; its inputs are "
                    f"{', '.join(inputs)}"
                )
        dtype = inputs[index_name].block.dtype
        if bound_name is not None and dtype not in INTEGER_DTYPES:
            raise BindingError(
                f"index_bounds: input {index_name!r} holds {dtype}, not integer indices"
            )
    return {name: bound for name, bound in bounds.items() if bound is not None}


def _check_index_range(
    cls: type[ModelBinding],
    index_name: str,
    indices: torch.Tensor,
    bound_name: str,
    bound: int,
    *,
    on_host: bool = False,
) -> None:
    """Indices must lie in [0, bound). On a GPU the check is queued on the stream, so the host does
    not wait for it; a failure there is a device-side assert instead of a silent wild access. With
    `on_host` the two extremes are read back instead (a host sync) and a failure raises
    `IndexRangeError`: for callers that wait for the device anyway (a remote call), and must not
    end the process's CUDA context with a device-side assert."""
    if not indices.is_cpu and not on_host:
        _queue_index_check(indices, bound, index_message(cls, index_name, bound_name, None))
        return
    found = indices_outside(indices, bound)
    if found is not None:
        message = index_message(cls, index_name, bound_name, bound)
        raise IndexRangeError(f"{message} (values {found[0]}..{found[1]})")


def _check_planned_index(
    cls: type[ModelBinding],
    views: Sequence[torch.Tensor],
    checks: tuple[_IndexCheck, ...],
    number: int,
) -> None:
    """A plan's index range check `number` of `checks` on its `views` (for the compiled checks,
    `IndexCheckedCall`, where they do not read the values or find one outside)."""
    position, index_name, bound_name, size = checks[number]
    _check_index_range(cls, index_name, views[position], bound_name, size)


def indices_outside(indices: torch.Tensor, bound: int) -> tuple[int, int] | None:
    """The lowest and highest index when some lie outside [0, bound), else None; any integer
    dtype, any layout. Device tensors are reduced there and the two extremes read back (a wait)."""
    count, rank = indices.numel(), indices.dim()
    if not count:
        return None
    extremes = (_buffers or _load_buffers())._index_extremes
    if not indices.is_cpu:
        import torch

        low, high = torch.stack(_device_extremes(indices)).tolist()  # one wait for the device
    elif (
        count < _COMPILED_EXTREMES_MAX
        and extremes is not None
        and (found := extremes(indices)) is not None
    ):
        low, high = found
    elif count <= 64 and rank <= 2:
        # A few values: Python's min and max over `tolist()` beat any reduction's fixed cost.
        values: typing.Any = indices.tolist()  # an int, a list, or a list of lists
        flat: list[int] = (
            [values] if rank == 0 else values if rank == 1 else [v for row in values for v in row]
        )
        low, high = min(flat), max(flat)
    elif count <= _TORCH_REDUCTION_MAX and indices.dtype.is_signed:
        # Inside a call, NumPy's first reduction runs cold code (~6 us more than alone; a GNN call
        # at E = 1e3 took 105 against 99 us): below this count torch's own pass costs less. It
        # flattens a padded [c, n] block through a scratch copy, and still beats per-row or
        # separate min and max passes over the strided view (4 against 6-7 us at 2 x 1e3).
        low_tensor, high_tensor = indices.aminmax()
        low, high = int(low_tensor), int(high_tensor)
    else:
        # One pass: seen as unsigned, a negative index is at least 2**(bits - 1), above any bound
        # up to that, so the largest value decides (NumPy reduces strided views of every width;
        # torch has no uint64 max). Half the time of a min and a max, 4x less than
        # `torch.aminmax` at 1e6 elements. Larger bounds (int8 indices into 300 elements): both.
        array = indices.numpy()
        bits = 8 * array.dtype.itemsize
        one_pass = array.dtype.kind == "u" or bound <= 1 << (bits - 1)
        if one_pass and int(array.view(_UNSIGNED[array.dtype.itemsize]).max()) < bound:
            return None
        low, high = int(array.min()), int(array.max())
    return (low, high) if low < 0 or high >= bound else None


# Index counts below which the range check reads the values in one compiled pass
# (`soagen/runtime/_compiled.c`, where it was built): 2-3x faster than the reductions below up to
# here ([1e3, 2] strided int64: 1.8 against 5.2 us), slower past 2e4 (it does not vectorize).
_COMPILED_EXTREMES_MAX = 1 << 13

# Index counts up to which the range check uses `torch.aminmax` (signed dtypes; torch 2.13 has no
# unsigned one past uint8): alone it costs what NumPy's one pass does up to ~4k values and 2x at 64k.
_TORCH_REDUCTION_MAX = 1 << 15

# NumPy's unsigned integer type of each item size, by name (NumPy is imported with torch).
_UNSIGNED = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def index_message(
    cls: type[ModelBinding], index_name: str, bound_name: str, bound: int | None
) -> str:
    """Without a bound for the device's check: its message is a constant of the fused kernel,
    compiled once per message, and the bound changes from event to event."""
    extent = f"{bound}), the elements of" if bound is not None else "n), n the elements of"
    return (
        f"{cls.NAME}: input {index_name!r} holds indices outside [0, {extent} {bound_name!r}; "
        f"the model was not run"
    )


def _queue_index_check(indices: torch.Tensor, bound: int, message: str) -> None:
    """Queue the range check on the indices' device, with no host wait. On a GPU with Triton it is
    one kernel (`index_kernel`). Otherwise: one reduction over them, then as few ops on its result
    as the dtype allows with ops CPU has too (it runs this code in tests, where `_assert_async`
    raises at once; torch's CPU kernels have no max or comparison of uint16/32/64). Inside a CUDA
    graph each kernel is a node, each replay checking the indices anew.

    - 8-bit: the largest value seen as uint8 (a negative int8 is 128 or more), one comparison, the
      assert: 3 ops; none for uint8 indices into 256 elements or more, all of which are in range.
    - A bound past the largest value of a signed type (int16 indices into 40k nodes): only the
      sign can be wrong, the smallest value compared with 0: 3 ops.
    - Otherwise min and max in one pass, two comparisons, their conjunction, the assert: 5 ops.
      uint16/32/64 indices into at most half their range are seen as the signed type of their
      width (no copy): a value past half the range turns negative, out of range either way. Past
      half the range, uint16/32 are widened to int64 (a copy) and only their maximum compared.
    """
    import torch

    if indices.numel() == 0:  # the reductions have no identity
        return
    message = message[:_ASSERT_MESSAGE_MAX]
    bits = 8 * indices.element_size()
    if not indices.dtype.is_signed and bound >= 1 << bits:
        return  # every value is in range
    if indices.is_cuda and queue_index_check(indices, bound, message):
        return
    half = 1 << (bits - 1)
    if bits == 8:
        limit = min(bound, 1 << 8 if indices.dtype == torch.uint8 else half)
        torch._assert_async(indices.view(torch.uint8).amax() < limit, message)
        return
    if not indices.dtype.is_signed:
        if bound > half and bits < 64:
            torch._assert_async(indices.to(torch.int64).amax() < bound, message)
            return
        # A bound past 2**63 (no buffer holds that many elements) is checked as 2**63.
        indices = indices.view(getattr(torch, f"int{bits}"))
    if bound >= half:
        torch._assert_async(indices.amin() >= 0, message)
        return
    low, high = torch.aminmax(indices)
    torch._assert_async(torch.logical_and(low >= 0, high < bound), message)


# The longest message torch's CUDA `_assert_async` takes (it refuses longer ones).
_ASSERT_MESSAGE_MAX = 254


def _device_extremes(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and largest index, reduced on the indices' device (non-empty indices)."""
    import torch

    # The reduction covers the signed types; a uint64 seen as int64 turns every value past 2**63
    # negative (out of range either way), narrower unsigned types widen exactly.
    if indices.dtype == torch.uint64:
        indices = indices.view(torch.int64)
    elif indices.dtype in (torch.uint16, torch.uint32):
        indices = indices.to(torch.int64)
    low, high = torch.aminmax(indices)
    return low, high


def outputs_in_schema_order(cls: type[ModelBinding], result: object) -> list[torch.Tensor]:
    """A model's return value as a list of tensors in schema order, one per declared output;
    OutputError for anything else. Plain Python over the result's structure: `torch.export` traces
    through it (`soagen.build.model.SchemaOrder`)."""
    tensor: type[torch.Tensor] = (_torch or _load_torch()).Tensor
    if isinstance(result, tensor):
        if len(cls.OUTPUTS) == 1:
            return [result]  # the common case, without the checks below
        result = [result]
    elif isinstance(result, (tuple, list)):
        pass  # the common case, tested first: a Mapping check costs an ABC lookup
    elif isinstance(result, Mapping):
        names = [spec.name for spec in cls.OUTPUTS]
        if sorted(map(str, result)) != sorted(names):
            raise OutputError(
                f"{cls.NAME} returned a dict with keys {', '.join(map(str, result))}; the schema's "
                f"outputs are {', '.join(names)}; nothing was written"
            )
        result = [result[name] for name in names]
    if not isinstance(result, (tuple, list)) or not all([isinstance(r, tensor) for r in result]):
        raise OutputError(
            f"{cls.NAME} returned {type(result).__name__}; a model returns a tensor, a tuple or list "
            f"of tensors, or a dict keyed by output name; nothing was written"
        )
    # Checked here, not only against output blocks: `soagen serve` sends results without them.
    if len(result) != len(cls.OUTPUTS):
        raise OutputError(
            f"{cls.NAME} returned {len(result)} output(s), the schema declares {len(cls.OUTPUTS)} "
            f"({', '.join(spec.name for spec in cls.OUTPUTS)}); nothing was written"
        )
    return list(result)


def same_n_groups(binding: type[ModelBinding]) -> dict[str, str]:
    """Each input layout -> the first input layout (in schema order) that `same n as` clauses
    tie it to, itself where none does: layouts of one group hold one element count."""
    names = list(dict.fromkeys(spec.block.layout for spec in binding.INPUTS))
    group = {name: name for name in names}

    def root(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    layout_of = {spec.name: spec.block.layout for spec in binding.INPUTS}
    for spec in binding.INPUTS:
        if spec.same_n_as is not None:
            first, second = sorted(
                (root(spec.block.layout), root(layout_of[spec.same_n_as])), key=names.index
            )
            group[second] = first
    return {name: root(name) for name in names}


def shared_members(cls: type[ModelBinding]) -> list[tuple[int, int]]:
    """(input position, output position) of the blocks that bind the same members of a layout."""
    return [
        (i, o)
        for i, source in enumerate(cls.INPUTS)
        for o, target in enumerate(cls.OUTPUTS)
        if source.block.layout == target.block.layout
        and set(source.block.members) & set(target.block.members)
    ]


def _share_elements(first: Collection, second: Collection) -> bool:
    """Whether two collections hold some of the same elements: slices of one buffer whose element
    ranges intersect, or (conservatively) buffers whose bytes intersect in any other way."""
    if not first.size or not second.size:
        return False
    one, other = first.buffer, second.buffer
    if one.device != other.device:
        return False
    if one.data_ptr() == other.data_ptr() and first.capacity == second.capacity:
        (start, stop), (other_start, other_stop) = first.element_range, second.element_range
        return start < other_stop and other_start < stop
    return (
        one.data_ptr() < other.data_ptr() + other.numel()
        and other.data_ptr() < one.data_ptr() + one.numel()
    )


def _check_outputs(
    cls: type[ModelBinding], results: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]
) -> None:
    """Every output must fit its block exactly: nothing is written unless all of them do (their
    count was checked with the return value)."""
    for spec, result, target in zip(cls.OUTPUTS, results, targets, strict=True):
        problem = None
        axes = spec.block.axes
        if result.shape != target.shape and _differ_only_along_n(axes, result.shape, target.shape):
            n = axes.index("n")
            raise OutputError(
                f"{cls.NAME} output {spec.name!r}: the model returned {result.shape[n]} elements, "
                f"but its output collection ({spec.block.layout}) holds {target.shape[n]}; "
                f"allocate it with the model's element count; nothing was written"
            )
        if result.shape != target.shape:
            problem = f"shape {list(result.shape)}, expected {list(target.shape)}"
        elif result.dtype != target.dtype:
            problem = f"dtype {result.dtype}, expected {target.dtype}"
        elif result.device != target.device:
            problem = f"device {result.device}, expected {target.device}"
        if problem is not None:
            raise OutputError(
                f"{cls.NAME} output {spec.name!r} has {problem} (axes {list(spec.block.axes)}); "
                f"nothing was written"
            )


def _differ_only_along_n(
    axes: Sequence[str], shape: Sequence[int], expected: Sequence[int]
) -> bool:
    """Whether two shapes of a block with axes `axes` differ in their element count alone."""
    return len(shape) == len(expected) == len(axes) and all(
        axis == "n" or size == wanted
        for axis, size, wanted in zip(axes, shape, expected, strict=True)
    )


def _batches(
    cls: type[ModelBinding],
    inputs: Mapping[str, Collection],
    outputs: Mapping[str, Collection],
    batch_size: int,
    whole: frozenset[str],
) -> Iterator[tuple[int, int]]:
    """(start, stop) of each slice: every collection but those of `whole` inputs is sliced alike."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    collections = {name: c for name, c in {**inputs, **outputs}.items() if name not in whole}
    sizes = {c.size for c in collections.values()}
    if len(sizes) != 1:
        detail = ", ".join(f"{name}: {c.NAME} n={c.size}" for name, c in collections.items())
        passed_whole = f" (inputs passed whole: {', '.join(sorted(whole))})" if whole else ""
        raise BindingError(
            f"batch_size slices every collection of {cls.NAME} but those of `whole` inputs, so "
            f"they must have the same size{passed_whole}; got {detail}"
        )
    # A slice starting at element s moves each column by s * itemsize bytes: keep that aligned.
    step = 1
    for spec in (*cls.INPUTS, *cls.OUTPUTS):
        if spec.name in whole:
            continue
        collection = collections[spec.name]
        itemsize = ITEMSIZE[spec.block.dtype]
        step = math.lcm(step, max(1, collection.ALIGNMENT // itemsize))
    batch = round_up(batch_size, step)
    (n,) = sizes
    for start in range(0, n, batch):
        yield start, min(n, start + batch)


@contextlib.contextmanager
def _on_stream(stream: object | None, device: torch.device) -> Iterator[None]:
    if stream is None:
        yield
        return
    import torch

    if device.type != "cuda":
        raise ValueError(f"stream= is for CUDA collections; these are on {device}")
    stream_device = getattr(stream, "device", device)
    if stream_device != device:
        # Eager kernels would follow the data's device and ignore the stream; AOTInductor's would
        # be launched on it, on the wrong GPU.
        raise ValueError(
            f"stream= is a stream of {stream_device}; these collections are on {device}"
        )
    with torch.cuda.stream(typing.cast("torch.cuda.Stream", stream)):
        yield
