"""CUDA graphs of whole model calls: `EdgeClassifier(net, graphs=True)`.

A binding made with `graphs=True` captures a call on CUDA collections into one CUDA graph and, at
later calls on the same memory, replays it: one launch instead of the call's Python and one launch
per kernel. The graph holds the whole call a plain one makes (`ModelBinding._execute`): the input
views, the index range check (queued on the device, so each replay checks the indices the buffers
hold then), the model, and the copy of each output into its output block. Calls on collections
elsewhere (CPU) run as usual.

Key. A graph reads and writes the addresses it was captured with, and every size and index bound
of that call is baked into it, so it serves only calls whose collections lie where those did: the
key is the caller's current stream (see Memory) and, for each input and output binding in schema
order, the collection's class, its buffer's address, its capacity and its element range (a slice's
start and size). Another buffer, another size or another slice is another key, captured at its first
call. The address decides, not the buffer object: a collection freed and a new one allocated at the
same address, of the same class and size, has the same views, which the graph reads correctly.

First call of a key, under a process-wide lock: the call runs eagerly three times (as many warm-up
runs as `torch.cuda.make_graphed_callables` makes by default) on a side stream (the stream the
capture will use, so the handles and workspaces torch makes per stream exist before it) into
scratch output collections of the same geometry, with every check a plain call makes (a model that
writes its inputs raises `InputModifiedError` here, before anything is captured: version counters
do not move when a graph replays). The first run places the model (and compiles it with
backend="compile"); TorchScript's profiling executor optimizes at the second and may fuse kernels
for a new shape a run later: the capture should record only what later calls run. The call is then
captured on that side stream, in thread-local capture mode (other threads' CUDA calls do not
invalidate it), replayed once on the caller's stream, and its outputs compared with the eager ones
within the tolerances of `soagen.runtime.agreement` (exact for integers; rtol 1e-3 and atol 1e-4
for float32). Not bitwise: models that sum with atomics (the example GNN's `scatter_reduce` on
CUDA) differ in the last bits from run to run, while a graph that reads memory after it was reused
is wrong by far more. That replay reads the values the capture ran on, so a graph that replays
what its capture computed (work launched outside the captured stream, which ran once at capture
and left its result in the pool) agrees there: the second call of the key, on the values the
buffers hold then, runs eagerly once more and compares its replay the same way, and only then is
the graph replayed without a check. A disagreement raises `GraphMismatchError`, naming the output,
puts the outputs back as they were and drops the graph; a capture that fails (a model that waits
for the device: `.item()`, `if` on a tensor, shapes that depend on values) raises
`GraphCaptureError`, outputs untouched, and the binding refuses its later captures alike. Running
out of device memory while capturing is raised as it is (`torch.OutOfMemoryError`), not held
against the model: a later call captures again. The `OUT_OF_MEMORY_REFUSAL`-th such capture in a
row raises `GraphCaptureError` instead, and the binding refuses its later captures. A first call
made while the caller's stream is itself being captured (inside `torch.cuda.graph`) raises
`GraphCaptureError` for that call alone: captures do not nest.

AOT packages run through AOTInductor's single-threaded entry point (`AotBackend.single_threaded`):
the thread-aware one records a CUDA event at each run and queries it at the next, and an event
recorded during a capture cannot be queried. The binding calls a package only under the lock.

From the third call of a key: the key, the model's training flag (a module back in training mode
goes to the eager run, which refuses it as a plain call does, instead of being replayed in eval
mode), and `graph.replay()`. From the second call with the same collection objects, the
binding's call plan (`planned_call`) holds their part of the key and skips the binding's checks of
them: what is left per call is their buffers' addresses (a wrapped tensor's storage can move), the
caller's stream, the lookup, the flag and the replay.

Memory: each binding keeps at most `graph_cache_size` graphs (8 by default): those not yet
checked at a second call dropped first (but the one just captured), then the least recently used,
so that a run of keys called once (each event's new buffers) takes one graph's place, not all of
them; a dropped graph is destroyed once no call is replaying it. All graphs captured
for one stream of one GPU (every binding's) share one memory pool: their intermediates reuse the
same memory, which is safe because calls on one stream run one after another. Pool memory a dropped
graph held is reused by later captures for that stream (`close()` drops a binding's graphs); the
pool itself stays, held by a one-kernel anchor graph, since torch cannot capture into a pool again
once its last graph is gone, while its stream is among the 16 most recently captured for
(`STREAMS_KEPT`); then it goes with its last graph.

What a replay does not see: what the call read on the host when it was captured. A module whose
parameters are replaced rather than updated in place (`module.weight = ...`, where
`load_state_dict` copies into them) is replayed with the old ones: `close()` the binding after such
a change. Random numbers, and host values or Python state that differ from call to call, make the
first replay disagree with the eager run (`GraphMismatchError`); a change that comes only after
that check is not seen.

The side stream comes from torch's pool of streams, as `torch.cuda.graph`'s own capture stream does;
the pool hands each of its 32 streams per GPU and priority out again in turn, so another thread
that launches work on a pool stream sharing the side stream's CUDA stream while a capture runs
would have that work recorded into it. Make the first calls of a graphed binding before other
threads use many pool streams.

Refused: backends whose work does not run on the caller's torch stream (ONNX Runtime; remote
bindings), at construction; `batch_size=` at the call (its slices are staged in collections made per
call, a new key each time: nothing would be replayed). `protect_inputs=True` is captured with the
rest: the copies are made inside the graph at each replay.
"""

from __future__ import annotations

import threading
import typing
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

from soagen.runtime.agreement import first_disagreement
from soagen.runtime.errors import (
    BindingError,
    GraphCaptureError,
    GraphMismatchError,
    SoaRuntimeError,
)
from soagen.runtime.model import _any_elements, _on_stream

if typing.TYPE_CHECKING:
    import weakref

    import torch

    from soagen.runtime.aot import AotBackend
    from soagen.runtime.collection import Collection
    from soagen.runtime.model import ModelBinding

_T = typing.TypeVar("_T")

DEFAULT_CACHE_SIZE = 8
# Backends whose calls are torch work on the caller's current stream, which a capture records.
CAPTURABLE = ("eager", "torchscript", "compile", "aot")
# Why the others cannot be captured.
_NOT_CAPTURABLE = {
    "onnxruntime": (
        "ONNX Runtime launches its kernels on a CUDA stream of its own, outside the torch stream a "
        "capture records (its own CUDA graphs need inputs bound at fixed addresses for the "
        "session's life)"
    ),
    "remote": (
        "its calls are requests the server answers, which runs the model there: there are no "
        "kernels here to capture"
    ),
}
# Callers' streams whose side stream and memory pool the CUDA capturer keeps (see `CudaCapturer`).
STREAMS_KEPT = 16
# Eager runs of a call before it is captured (see the module documentation).
WARM_UP_CALLS = 3
# Captures in a row that run out of device memory before a binding refuses to capture.
OUT_OF_MEMORY_REFUSAL = 3
# One capture at a time in the process: torch's allocator and the shared pools expect it.
_capture_lock = threading.RLock()


class Replayable(typing.Protocol):
    """A captured call."""

    def replay(self) -> None: ...


class Capturer(typing.Protocol):
    """Where graphs are captured and replayed: CUDA (`CudaCapturer`), or a test's double."""

    # The device type whose calls are captured; others run as usual.
    device_type: str

    def stream(self, device: torch.device) -> Hashable:
        """The caller's current stream on `device`, as part of a key."""
        ...

    def capturing(self, device: torch.device) -> bool:
        """Whether the caller's current stream on `device` is being captured now."""
        ...

    def warm_up(self, device: torch.device, stream: Hashable, run: Callable[[], _T]) -> _T:
        """Run `run` eagerly where captures for `stream` are made; the caller's stream waits
        for it."""
        ...

    def capture(
        self, device: torch.device, stream: Hashable, run: Callable[[], object]
    ) -> Replayable:
        """Capture `run` into a graph that replays on `stream`; raises what `run` or the capture
        raised."""
        ...


def call_graphs(binding: ModelBinding, graphs: object, cache_size: object) -> CallGraphs | None:
    """The graphs of a binding made with `graphs=True`, None for `graphs=False`; refuses at once
    what is known to be impossible."""
    cls = type(binding)
    if not isinstance(graphs, bool):
        raise ValueError(f"graphs must be True or False, got {graphs!r}")
    if cache_size is not None and (
        isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1
    ):
        raise ValueError(f"graph_cache_size must be a positive integer, got {cache_size!r}")
    if not graphs:
        if cache_size is not None:
            raise BindingError(
                "graph_cache_size bounds the CUDA graphs a binding made with graphs=True keeps; "
                "pass graphs=True with it, or leave it out"
            )
        return None
    backend = binding._backend
    why = _NOT_CAPTURABLE.get(backend.kind)
    if why is None and backend.kind not in CAPTURABLE:
        why = f"soagen does not know whether backend kind {backend.kind!r} runs on the caller's stream"
    if why is not None:
        raise BindingError(
            f"graphs=True: {cls.NAME} runs {backend.description} ({backend.kind}), which cannot "
            f"be captured into a CUDA graph: {why}. Create the binding with graphs=False"
        )
    if backend.kind == "aot":
        typing.cast("AotBackend", backend).single_threaded = True
    return CallGraphs(binding, cuda_capturer(), cache_size or DEFAULT_CACHE_SIZE)


class CallGraphs:
    """The graphs of one binding's calls, by key (see the module documentation)."""

    def __init__(self, binding: ModelBinding, capturer: Capturer, cache_size: int) -> None:
        from soagen.runtime.backends import CompileBackend, EagerBackend

        self._binding = binding
        self._capturer = capturer
        self.device_type = capturer.device_type
        self.cache_size = cache_size
        # The graphs replayed without a check, least recently used first (what `planned_call`
        # looks up), and those checked at their capture only, oldest first (see `_confirm`).
        self._graphs: OrderedDict[Hashable, _Graph] = OrderedDict()
        self._unconfirmed: OrderedDict[Hashable, _Graph] = OrderedDict()
        # The capture that failed: a model that cannot be captured is not warmed up and captured
        # again at every call (each failed capture also leaves torch a little state; `_abandon`).
        self._refusal: GraphCaptureError | None = None
        # Captures in a row that ran out of device memory: a few are let through (memory may be
        # free at a later call), more are a refusal, as each may leave a pool behind (`_abandon`).
        self._out_of_memory = 0
        cls = type(binding)
        self._input_names = tuple(spec.name for spec in cls.INPUTS)
        self._output_names = tuple(spec.name for spec in cls.OUTPUTS)
        backend = binding._backend
        self._module = (
            backend.module if isinstance(backend, EagerBackend | CompileBackend) else None
        )

    def __len__(self) -> int:
        """Graphs kept now."""
        return len(self._graphs) + len(self._unconfirmed)

    def clear(self) -> None:
        """Drop every graph; each is destroyed once no call is replaying it."""
        self._graphs.clear()
        self._unconfirmed.clear()

    def call(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
        stream: object | None,
        batch_size: int | None,
    ) -> None:
        """`ModelBinding.run` for collections on `device_type`, checked as a plain call is up to
        where it runs the model."""
        if batch_size is not None:
            raise BindingError(
                f"batch_size: {type(self._binding).NAME} was created with graphs=True, which "
                f"captures whole calls; the slices of a batched call are staged in collections "
                f"made per call, new memory each time, so no graph would ever be replayed. Call "
                f"it without batch_size, or create the binding with graphs=False"
            )
        if stream is None:
            self._call(inputs, outputs, device)
            return
        with _on_stream(stream, device):
            self._call(inputs, outputs, device)

    def _call(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
    ) -> None:
        # What `ModelBinding.run` checked before handing the call here holds for a replay as for
        # a plain call: names and layouts, one device, writable outputs, `same n as` sizes.
        # Left to check per call, each for a reason:
        # - every output empty: a plain call runs nothing then, and neither is anything captured;
        if not _any_elements(outputs):
            return
        # - the key: the graph holds the addresses, sizes and index bounds of its first call and
        #   replays on its stream's memory pool; a collection's address, not its buffer object,
        #   is compared (`_placement`);
        key = self._key(inputs, outputs, device)
        graph = self._graphs.get(key)
        # - the module's training flag: a replay would run eval-mode kernels where a plain call
        #   refuses the module (the eager run of a capture refuses it the same way).
        if graph is not None and (self._module is None or not self._module.training):
            try:
                self._graphs.move_to_end(key)
            except KeyError:  # dropped meanwhile by another thread's capture: still ours to run
                pass
            graph.replay()
            return
        if self._capturer.capturing(device):
            raise GraphCaptureError(
                f"{type(self._binding).NAME}: called while the caller's CUDA stream on {device} is "
                f"being captured (inside torch.cuda.graph, or another graph's capture); this call "
                f"needs a capture or check of its own first, and captures do not nest. Make the "
                f"first two calls on these collections outside the capture, or create the binding "
                f"with graphs=False"
            )
        with _capture_lock:
            graph = self._graphs.get(key)  # another thread may have captured it meanwhile
            usable = self._module is None or not self._module.training
            if graph is not None and usable:
                graph.replay()
                return
            unconfirmed = self._unconfirmed.get(key) if usable else None
            if unconfirmed is not None:
                del self._unconfirmed[key]  # kept again only if it agrees
                self._confirm(key, unconfirmed, inputs, outputs, device)
                return
            if self._refusal is not None:
                raise GraphCaptureError(str(self._refusal))
            try:
                self._capture(key, inputs, outputs, device)
            except GraphCaptureError as error:
                self._refusal = error
                raise

    def planned_call(
        self, collections: tuple[weakref.ref[Collection], ...], device: torch.device
    ) -> Callable[[], None]:
        """A call's plan (`ModelBinding._graph_plan`): `call` for these collections (inputs then
        outputs in schema order, checked by the binding and alive while the call runs) with the
        part of the key they fix computed once. Per call there remain the buffers' addresses, the
        caller's stream, the lookup and the module's training flag; a graph not found, or a buffer
        whose storage moved, goes the way of `_call`."""
        alive = [typing.cast("Collection", ref()) for ref in collections]
        placements = tuple(map(_placement, alive))
        # A collection's class, capacity and element range are fixed for its life, its buffer
        # tensor too, but not that tensor's address: a wrapped tensor whose storage the user
        # resizes moves, and a graph must not replay at the old one.
        import torch

        address = torch.Tensor.data_ptr
        buffers = tuple({id(c._memory.buffer): c._memory.buffer for c in alive}.values())
        addresses = tuple(map(address, buffers))
        stream_of, graphs, module = self._capturer.stream, self._graphs, self._module
        first_output = len(self._input_names)

        def call() -> None:
            if tuple(map(address, buffers)) == addresses:
                key = (stream_of(device), *placements)
                graph = graphs.get(key)
                if graph is not None and (module is None or not module.training):
                    try:
                        graphs.move_to_end(key)
                    except KeyError:  # dropped meanwhile by another thread's capture
                        pass
                    graph.replay()
                    return
            called = [typing.cast("Collection", ref()) for ref in collections]
            self._call(
                dict(zip(self._input_names, called[:first_output], strict=True)),
                dict(zip(self._output_names, called[first_output:], strict=True)),
                device,
            )

        from soagen.runtime import buffers as buffer_module

        compiled = buffer_module._GraphCall
        # It reads plain tensors' addresses as `torch.Tensor.data_ptr` does, whatever a subclass
        # says: a subclass's buffer keeps this function.
        if compiled is None or any(type(buffer) is not torch.Tensor for buffer in buffers):
            return call
        # The replay without this function's frame (`soagen/runtime/_compiled.c`); it hands any
        # other call to this function.
        return compiled(buffers, addresses, stream_of, device, placements, graphs, module, call)

    def _key(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
    ) -> tuple[Hashable, ...]:
        return (
            self._capturer.stream(device),
            *[_placement(inputs[name]) for name in self._input_names],
            *[_placement(outputs[name]) for name in self._output_names],
        )

    def _capture(
        self,
        key: tuple[Hashable, ...],
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
    ) -> None:
        """Warm up, capture, replay once and compare; keep the graph, to be checked once more at
        the key's next call (`_confirm`), if it agrees."""
        import torch

        binding, capturer = self._binding, self._capturer
        cls = type(binding)
        targets = [outputs[name].block(block) for name, block in binding._output_blocks]
        expected = self._run_eagerly(key, inputs, outputs, device, WARM_UP_CALLS)
        # Held with the graph: the module's copy on this device, a loaded package (the weights
        # its replays read), whatever `close()` or the backend would otherwise drop.
        runner = binding._backend.on(device)
        try:
            graph = capturer.capture(
                device, key[0], lambda: binding._execute(inputs, outputs, device, targets)
            )
        except SoaRuntimeError:
            raise
        except torch.OutOfMemoryError as error:
            self._out_of_memory += 1
            if self._out_of_memory < OUT_OF_MEMORY_REFUSAL:
                raise
            raise GraphCaptureError(
                f"{cls.NAME}: {binding._backend.description} on {device} ran out of device memory "
                f"in {self._out_of_memory} captures in a row: {_first_line(error)}; "
                f"nothing was written, and this binding's later calls that need a capture are "
                f"refused alike. Free device memory and create the binding anew, or create it "
                f"with graphs=False"
            ) from error
        # torch's CUDA errors; the model's own errors pass as they are
        except RuntimeError as error:
            raise GraphCaptureError(
                f"{cls.NAME}: {binding._backend.description} on {device} cannot be captured into "
                f"a CUDA graph: {type(error).__name__}: {_first_line(error)}. A model that "
                f"waits for the GPU during its call (.item(), .tolist(), .cpu(), bool() or `if` on "
                f"a tensor, printing one, shapes that depend on values such as nonzero() or "
                f"boolean-mask indexing) cannot be; nothing was written, and this binding's later "
                f"calls that need a capture are refused alike. Create the binding with graphs=False"
            ) from error
        self._out_of_memory = 0
        kept = _Graph(graph, runner)
        self._replay_checked(kept, inputs, targets, expected, "captured for this call")
        self._unconfirmed[key] = kept
        self._bound(key)

    def _confirm(
        self,
        key: tuple[Hashable, ...],
        graph: _Graph,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
    ) -> None:
        """The key's second call: its replay compared with an eager run of this call, on the
        values the buffers hold now (see the module documentation); kept if it agrees."""
        targets = [outputs[name].block(block) for name, block in self._binding._output_blocks]
        expected = self._run_eagerly(key, inputs, outputs, device, 1)
        self._replay_checked(graph, inputs, targets, expected, "replayed at this later call")
        self._graphs[key] = graph
        self._bound(key)

    def _run_eagerly(
        self,
        key: tuple[Hashable, ...],
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
        runs: int,
    ) -> list[torch.Tensor]:
        """The call run eagerly `runs` times where its captures are made, into scratch outputs of
        the same geometry (the caller's outputs are written by a checked graph or not at all):
        the last run's output blocks."""
        binding = self._binding

        def run() -> list[torch.Tensor]:
            scratch = _scratch_outputs(outputs, device)  # made on the stream the runs use
            expected = [scratch[name].block(block) for name, block in binding._output_blocks]
            for _ in range(runs):
                binding._execute(inputs, outputs, device, expected)
            return expected

        return self._capturer.warm_up(device, key[0], run)

    def _replay_checked(
        self,
        graph: _Graph,
        inputs: Mapping[str, Collection],
        targets: list[torch.Tensor],
        expected: list[torch.Tensor],
        when: str,
    ) -> None:
        """Replay `graph` into the output blocks `targets` and compare them with `expected`: on a
        disagreement the blocks are put back and `GraphMismatchError` raised."""
        held = [target.clone() for target in targets]
        graph.replay()
        found = first_disagreement(self._output_names, targets, expected)
        if found is None:
            return
        for target, before in zip(targets, held, strict=True):
            target.copy_(before)
        sizes = ", ".join(f"{name} n={inputs[name].size}" for name in self._input_names)
        raise GraphMismatchError(
            f"{type(self._binding).NAME}: the CUDA graph {when} ({sizes}) disagrees with the "
            f"eager run of the same call on output {found.output!r}: {found.detail}. The graph "
            f"was dropped and the outputs left as they were. A replay repeats what the call did "
            f"when it was captured: a model whose work depends on host values, Python state or "
            f"random numbers, or runs outside the captured stream, differs. Create the binding "
            f"with graphs=False"
        )

    def _bound(self, kept: Hashable) -> None:
        """At most `cache_size` graphs, `kept` (just captured or confirmed) among them: those not
        yet confirmed go first, oldest first (keys called once, as each event's new buffers make,
        take each other's place), then the least recently used."""
        while len(self._graphs) + len(self._unconfirmed) > self.cache_size:
            unconfirmed = next((key for key in self._unconfirmed if key != kept), None)
            if unconfirmed is not None:
                del self._unconfirmed[unconfirmed]
            else:
                self._graphs.popitem(last=False)


class _Graph:
    """A captured call and what its replays read that must not be freed before it."""

    __slots__ = ("_held", "replay")

    def __init__(self, graph: Replayable, runner: object) -> None:
        self.replay = graph.replay
        self._held = (graph, runner)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def _placement(collection: Collection) -> Hashable:
    """Where a collection's views lie: its class (the geometry), buffer address, capacity and
    element range. Whether the buffer is the object the graph was captured with does not matter:
    another buffer at the same address, of the same class and capacity, has the same views."""
    return (
        type(collection),
        collection._memory.buffer.data_ptr(),
        collection.capacity,
        collection.element_range,
    )


def _scratch_outputs(
    outputs: Mapping[str, Collection], device: torch.device
) -> dict[str, Collection]:
    """A new collection per output collection, its views of the same geometry (a slice of a new
    buffer of the same capacity for a slice)."""
    made: dict[int, Collection] = {}
    for collection in outputs.values():
        if id(collection) not in made:
            start, stop = collection.element_range
            whole = type(collection).allocate(collection.capacity, device)
            made[id(collection)] = whole.slice(start, stop)
    return {name: made[id(collection)] for name, collection in outputs.items()}


class CudaCapturer:
    """Graphs on CUDA. For each GPU and caller's stream: one side stream, where warm-ups and
    captures run (a capture needs a stream other than the legacy default one, and torch's pools
    share memory best between captures made on one stream), and one memory pool shared by every
    graph captured for that stream (see the module documentation), for the `STREAMS_KEPT` streams
    most recently captured for. Used under `_capture_lock`, but for `stream`."""

    device_type = "cuda"

    def __init__(self) -> None:
        # The streams most recently captured for, at most `STREAMS_KEPT`.
        self._sides: OrderedDict[Hashable, tuple[torch.cuda.Stream, typing.Any]] = OrderedDict()
        # Each pool's anchor (see `_anchored_pool`), by stream.
        self._anchors: dict[Hashable, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # Captures that failed to end (see `_abandon`): a binding adds one at most with the
        # capture it is refused for, and one for each that ran out of memory (fewer than
        # `OUT_OF_MEMORY_REFUSAL` in a row).
        self._abandoned: list[torch.cuda.CUDAGraph] = []
        # The raw handle of a GPU's current stream: what Inductor's generated code asks torch
        # for, without a Stream object per call (looked up at the first call: CUDA builds only).
        self._raw_stream: Callable[[int], int] | None = None

    def stream(self, device: torch.device) -> Hashable:
        raw_stream = self._raw_stream
        if raw_stream is None:
            import torch

            raw_stream = self._raw_stream = torch._C._cuda_getCurrentRawStream
        index = device.index
        if index is None:  # collections' buffers name their GPU; a bare "cuda" is the current one
            import torch

            index = torch.cuda.current_device()
        return index, raw_stream(index)

    def capturing(self, device: torch.device) -> bool:
        import torch

        with torch.cuda.device(device):
            return torch.cuda.is_current_stream_capturing()

    def _side(self, stream: Hashable) -> tuple[torch.cuda.Stream, typing.Any]:
        found = self._sides.get(stream)
        if found is not None:
            self._sides.move_to_end(stream)
            return found
        import torch

        index = typing.cast("tuple[int, int]", stream)[0]
        side = torch.cuda.Stream(device=index)  # type: ignore[no-untyped-call]
        found = (side, self._anchored_pool(index, side, stream))
        self._sides[stream] = found
        while len(self._sides) > STREAMS_KEPT:
            # A caller with a new stream per call would otherwise pin a pool for each. The
            # dropped pool goes with its last graph; a later capture for that stream gets a new
            # one (torch cannot capture into the old one again).
            dropped, _ = self._sides.popitem(last=False)
            self._anchors.pop(dropped, None)
        return found

    def _anchored_pool(self, index: int, side: torch.cuda.Stream, stream: Hashable) -> typing.Any:
        """A new memory pool for the captures on `side`, held by an anchor: a graph of one small
        kernel, captured into it, kept as long as the pool is used. Torch counts a pool's users
        (graphs and captures under way) and takes a pool whose count fell to 0 for gone: a later
        capture into it fails an internal assertion. So without the anchor, a binding closed,
        or a binding whose graphs were all dropped, would break every later capture for the
        stream. The pool's memory stays with it (reused by later captures) while the stream is
        kept (`_side`). The anchor's capture also ends the default generator's capture mode that a failed
        capture leaves on torch < 2.13 (see `_abandon`)."""
        import torch

        with torch.cuda.device(index), torch.cuda.stream(side):
            pool = torch.cuda.graph_pool_handle()
            scratch = torch.zeros(1, device=torch.device("cuda", index))
            anchor = torch.cuda.CUDAGraph()
            # Thread-local, as every capture here: other threads' CUDA calls go on meanwhile.
            anchor.capture_begin(pool=pool, capture_error_mode="thread_local")
            scratch.add_(1)
            anchor.capture_end()
        self._anchors[stream] = (anchor, scratch)
        return pool

    def warm_up(self, device: torch.device, stream: Hashable, run: Callable[[], _T]) -> _T:
        import torch

        side, _ = self._side(stream)
        current = torch.cuda.current_stream(device)
        side.wait_stream(current)  # the inputs as the caller's stream leaves them
        try:
            with torch.cuda.stream(side):
                return run()
        finally:
            current.wait_stream(side)

    def capture(
        self, device: torch.device, stream: Hashable, run: Callable[[], object]
    ) -> Replayable:
        import torch

        side, pool = self._side(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                run()
            except BaseException:
                self._abandon(graph, stream, end=True)
                raise
            try:
                graph.capture_end()
            except BaseException:
                self._abandon(graph, stream, end=False)
                raise
        return graph

    def _abandon(self, graph: torch.cuda.CUDAGraph, stream: Hashable, *, end: bool) -> None:
        """Leave a capture that failed, on its side stream: end it (where `end`), then undo what
        torch's `capture_end` leaves undone when ending fails (a capture that a host wait
        invalidated fails to end). Errors here add nothing to the one being raised.

        Left undone by a failed end, each of which breaks later work in the process:
        - the device allocator goes on counting a capture under way into the pool (which
          `torch.cuda.empty_cache()` then refuses): ended and released here;
        - the pinned-host allocator goes on recording into the pool, and torch offers no call to
          end that: the stream gets a fresh pool, and the graph is kept, since the host
          allocator's record reads it;
        - torch < 2.13 leaves the default CUDA generator in capture mode, so that every later
          random-number op on that GPU fails: the new pool's anchor, a capture that ends, takes
          it out."""
        import torch

        if end:
            try:
                graph.capture_end()
            except Exception:
                pass
        try:
            graph.pool()  # torch counts the capture as ended: the graph releases the pool as it goes
            return
        except Exception:
            pass
        index, pool = typing.cast("tuple[int, int]", stream)[0], self._sides[stream][1]
        for undo in (torch._C._cuda_endAllocateToPool, torch._C._cuda_releasePool):
            try:
                undo(index, pool)
            except Exception:  # already done by the part of capture_end that ran
                pass
        self._abandoned.append(graph)
        side = self._sides[stream][0]
        try:
            self._sides[stream] = (side, self._anchored_pool(index, side, stream))
        except Exception:
            del self._sides[stream]  # the next capture for the stream tries again


_cuda_capturer: CudaCapturer | None = None


def cuda_capturer() -> CudaCapturer:
    """The process's capturer: graphs of every binding share its pools."""
    global _cuda_capturer
    with _capture_lock:
        if _cuda_capturer is None:
            _cuda_capturer = CudaCapturer()
        return _cuda_capturer


__all__ = ["CallGraphs", "Capturer", "CudaCapturer", "Replayable", "call_graphs", "cuda_capturer"]
