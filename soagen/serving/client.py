"""Remote model calls: `EdgeClassifier.remote("127.0.0.1:8001")` runs the model on a Triton server.

The object `remote` returns is an instance of the generated class, so its `__call__` is the local
one, typed the same (collections in, `out=` filled, `batch_size=` slices); only the step that runs
the model differs. Per call (per slice with `batch_size`) it sends one request over gRPC holding each
input block once, in its wire form (`soagen.serving.wire`), and waits for the response.

Tensors. At its first call the client reads the served model's configuration and sends each block
as the server declares it: in soagen's wire form, storage order with a batch axis of 1 and bfloat16
as its bits (`soagen serve`, and the Python-backend repositories of `soagen triton` on any
tritonserver; see `soagen.serving.wire`), or in declared order without a batch axis (the libtorch
repositories of `soagen triton --backend pytorch`); a tensor missing or of another shape or
datatype is a `RemoteConfigurationError` before anything is sent.

Copies. With shared memory (`shared_memory=`, by default when the server is on a loopback address)
each input block is copied once, from the collection's buffer into a system shared-memory region
registered with the server (a `memcpy` per member column), and the server writes the outputs into
the same region: nothing else crosses the socket but the request's description. Without it, each
host block is copied once into the request's bytes (NumPy's `tobytes`), which gRPC then serialises;
a GPU block is first copied to host memory, so it is copied twice (`stats` counts both).
Collections on a GPU use a CUDA shared-memory region on their GPU instead (`CudaRegion`): each block
is copied there on the GPU, on the caller's current stream, which is synchronised before the request
goes (the server reads the region on its own streams); the server writes the outputs there, and they
are copied into the output collection on the GPU. That needs tritonclient's CUDA utilities
(`cuda-python`) and a server that accepts the region (GPU-enabled, on this host); where either is
missing, GPU blocks are copied to host memory in that same one copy. `stats.bytes_copied` counts
what the client copies, `stats.bytes_to_host` what of it went from a GPU to host memory.

Shared-memory regions (`soagen.serving.shared_memory`: the regions, their pool and the copies into
them) are registered once and reused across calls: one per call in flight, grown when a call needs
more, unregistered and removed by `close()` (or when the object is collected).
PyTriton's server guards registration with its access token (`access_token=`, which `soagen serve`
writes to `--token-file`); when registration is refused, or the server cannot open the region (it
runs in another container, say), a client that asked for shared memory by default (`None`) sends
the blocks in the request instead, and one that asked for it (`True`) raises. A refused CUDA region
is not an error: that call's blocks go in the request, and later calls use host memory.

Failures. Each attempt waits at most `timeout` seconds. An unreachable server, a connection lost
mid-request or a timeout is retried up to `retries` times with a growing pause (50 ms, 100 ms, ...
at most 1 s); after that the call raises `RemoteUnavailableError` naming the URL, or, with
`fallback=` (a local model), runs the model locally on the same collections. An error the server
answers with (the model raised, an index out of range) is raised at once as `RemoteInferenceError`.
Outputs are written only after the whole response is checked (every output present, with the
declared datatype and exactly the output block's shape), so a failed call leaves the output
collections as they were, and each call writes its outputs once: from the server's one validated
response, or from the local fallback.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
import typing
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from soagen.dsl.layout import round_up
from soagen.runtime.backends import Backend, Runner
from soagen.runtime.errors import BindingError
from soagen.runtime.model import ModelBinding
from soagen.serving.errors import (
    RemoteConfigurationError,
    RemoteInferenceError,
    RemoteResponseError,
    RemoteUnavailableError,
)
from soagen.serving.shared_memory import (
    ALIGN,
    Region,
    RegionPool,
    Source,
    block_nbytes,
    cuda_shared_memory,
    destroy_pool,
)
from soagen.serving.wire import ERROR_OUTPUT, WireTensor, declared_order, wire_tensors

if typing.TYPE_CHECKING:
    import torch
    from numpy.typing import NDArray

    from soagen.runtime.collection import Collection
    from soagen.runtime.spec import BlockSpec

_M = typing.TypeVar("_M", bound=ModelBinding)

# gRPC statuses worth another attempt: the server is down, restarting or too slow this time.
_TRANSIENT = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
_ACCESS_HEADER = "triton-grpc-protocol-triton-access-token"
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.05, 1.0
# `package.module.SomeError: message`, as a traceback's last line gives an exception.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception)): (.+)$")


@dataclass
class RemoteStats:
    """What a remote binding has done so far (counts since it was made)."""

    calls: int = 0  # model runs asked for (one per call, or per slice with batch_size)
    attempts: int = 0  # requests sent, retries included
    retries: int = 0
    fallbacks: int = 0  # runs done by the local fallback model
    writes: int = 0  # runs whose outputs were written from a validated server response
    bytes_copied: int = 0  # input bytes the client copied: into shared memory or into requests
    bytes_shared: int = 0  # of those, the bytes copied into shared memory (system or CUDA)
    bytes_to_host: int = 0  # of those, the bytes copied from a GPU to host memory
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class _ServerBackend(Backend):
    """A remote binding's backend: it names the server; `RemoteBinding._run_once` does the work."""

    kind = "remote"

    def __init__(self, url: str, model_name: str) -> None:
        super().__init__(f"{model_name} at {url}")

    def place(self, device: torch.device) -> Runner:
        raise NotImplementedError("a remote binding runs its model on the server")


class RemoteBinding(ModelBinding):
    """The part of a remote binding that differs from a local one: mixed into the generated class
    by `remote_class`. Build one with `GeneratedModel.remote(url, ...)`."""

    _local_class: typing.ClassVar[type[ModelBinding]]

    def __init__(
        self,
        url: str,
        *,
        model_name: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        fallback: object | None = None,
        shared_memory: bool | None = None,
        access_token: str | None = None,
        index_bounds: Mapping[str, str | None] | None = None,
    ) -> None:
        cls = type(self)
        local = cls._local_class
        if isinstance(fallback, ModelBinding):
            if fallback.NAME != local.NAME:
                raise BindingError(
                    f"fallback is a {fallback.NAME} binding; {local.NAME}.remote needs a "
                    f"{local.NAME}"
                )
        elif fallback is not None:
            fallback = local(fallback, index_bounds=index_bounds)
        self.url = _checked_url(url)
        self.model_name = cls.NAME if model_name is None else model_name
        if not isinstance(self.model_name, str) or not self.model_name:
            raise RemoteConfigurationError(
                f"model_name must be a non-empty string, got {model_name!r}"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise RemoteConfigurationError(
                f"timeout must be a positive number of seconds, got {timeout!r}"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise RemoteConfigurationError(f"retries must be an integer >= 0, got {retries!r}")
        if shared_memory not in (None, True, False):
            raise RemoteConfigurationError(
                f"shared_memory must be True, False or None (automatic), got {shared_memory!r}"
            )
        if access_token is not None and (not isinstance(access_token, str) or not access_token):
            raise RemoteConfigurationError("access_token must be a non-empty string or None")
        self.timeout = float(timeout)
        self.retries = retries
        self.fallback: ModelBinding | None = fallback
        self.shared_memory_requested = shared_memory
        self._use_shared_memory = (
            shared_memory if shared_memory is not None else _is_loopback(self.url)
        )
        self._headers = {_ACCESS_HEADER: access_token} if access_token else None
        # Whether a GPU's data goes through CUDA shared memory: None until the first such call.
        self._cuda_regions: bool | None = None
        self.cuda_shared_memory_refusal = ""  # why the server refused it, when it did
        # Everything `run` reads is set as for a local binding; the backend stands in for the server.
        super().__init__(_ServerBackend(self.url, self.model_name), index_bounds=index_bounds)
        self._inputs = wire_tensors(cls.INPUTS)
        self._outputs = wire_tensors(cls.OUTPUTS)
        self._configured = False  # the server's tensor layout is read at the first call
        self._error_output = False  # whether the server answers failed events in ERROR_OUTPUT
        self._configure_lock = threading.Lock()
        self.stats = RemoteStats()
        self._grpc = _tritonclient()
        self._client = self._grpc.InferenceServerClient(
            self.url,
            channel_args=[
                # A restarted server is found again within a second, not after gRPC's 2 minutes.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._pool = RegionPool()
        self._closed = False
        self._in_flight = 0  # calls between their start and their return, for close()
        self._idle = threading.Condition()
        self._finalizer = weakref.finalize(self, _close_quietly, self._client, self._pool)

    @property
    def uses_shared_memory(self) -> bool:
        """Whether the next call sends its blocks through shared memory."""
        return self._use_shared_memory

    @property
    def uses_cuda_shared_memory(self) -> bool | None:
        """Whether calls on a GPU's data send their blocks through CUDA shared memory (else
        through host memory): None before the first such call; False where tritonclient's CUDA
        utilities do not load, or the server refused a region (`cuda_shared_memory_refusal`)."""
        return self._cuda_regions if self._use_shared_memory else False

    def __repr__(self) -> str:
        return f"<{type(self).NAME} on Triton at {self.url} (model {self.model_name!r})>"

    def close(self) -> None:
        """Wait for the calls in flight (from other threads), then unregister and remove the
        shared-memory regions, close the connection, and close the local fallback (its placed
        runners). Later calls raise `RemoteConfigurationError`."""
        with self._idle:
            if self._closed:
                return
            self._closed = True  # no call starts from here on
            # Calls in flight keep their region and the connection until they return (each is
            # bounded by its timeout and retries).
            self._idle.wait_for(lambda: self._in_flight == 0)
        if self.fallback is not None:
            self.fallback.close()
        for region in [region for region in self._pool.all if region.registered_in >= 0]:
            try:
                region.unregister(self._client, self._headers, min(self.timeout, 2.0))
            except Exception:  # the server may be gone: its registrations went with it
                break
        self._finalizer()

    def server_statistics(self) -> dict[str, typing.Any]:
        """Triton's statistics of the served model (inference and execution counts, queue and
        compute times); PyTriton's server wants `access_token` for them."""
        try:
            answer = self._client.get_inference_statistics(
                self.model_name, headers=self._headers, as_json=True, client_timeout=self.timeout
            )
        except self._grpc_error() as error:
            raise RemoteInferenceError(
                f"{self.url}: statistics of {self.model_name!r}: {_message(error)}"
            ) from None
        stats: list[dict[str, typing.Any]] = answer.get("model_stats", [])
        if not stats:
            raise RemoteInferenceError(f"{self.url} has no statistics for {self.model_name!r}")
        return stats[0]

    # The step that differs from a local binding.

    def _execute(
        self,
        inputs: Mapping[str, Collection],
        outputs: Mapping[str, Collection],
        device: torch.device,
        targets: Sequence[torch.Tensor],
    ) -> None:
        """Send, check, write (or run the fallback), counted in flight for `close`."""
        cls = type(self)
        with self._in_flight_call():
            self.stats.add(calls=1)
            if self.index_bounds:
                # On a GPU's data the extremes are read back: the call waits for the GPU anyway,
                # and a device-side assert would end this process's CUDA context.
                self._check_index_ranges(
                    inputs,
                    [inputs[spec.name].block(spec.block) for spec in cls.INPUTS],
                    on_host=True,
                )
            from soagen.runtime.buffers import copy_values

            try:
                with self._remote_results(inputs, targets, device) as results:
                    for target, result in zip(targets, results, strict=True):
                        copy_values(target, result)
                self.stats.add(writes=1)
            except RemoteUnavailableError:
                if self.fallback is None:
                    raise
                self.stats.add(fallbacks=1)
                self.fallback._run_once(inputs, outputs, device)

    @contextmanager
    def _in_flight_call(self) -> Iterator[None]:
        """A call on an open binding, which `close` waits for."""
        with self._idle:
            if self._closed:
                raise RemoteConfigurationError(
                    f"{type(self).NAME}: this remote binding to {self.url} is closed"
                )
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                if not self._in_flight:
                    self._idle.notify_all()

    @contextmanager
    def _remote_results(
        self,
        inputs: Mapping[str, Collection],
        targets: Sequence[torch.Tensor],
        device: torch.device,
    ) -> Iterator[list[torch.Tensor]]:
        """The server's outputs, checked against the output blocks, as tensors in declared order
        (views of the shared-memory region or of the response, valid inside the block)."""
        cls = type(self)
        if not self._configured:
            self._configure()
        sources = [
            _wire_source(inputs[spec.name], spec.block, wire)
            for spec, wire in zip(cls.INPUTS, self._inputs, strict=True)
        ]
        region: Region | None = None
        try:
            if self._use_shared_memory:
                size = sum(
                    round_up(block_nbytes(source.shape, wire), ALIGN)
                    for source, wire in zip(sources, self._inputs, strict=True)
                )
                size += sum(
                    round_up(block_nbytes(target.shape, wire), ALIGN)
                    for target, wire in zip(targets, self._outputs, strict=True)
                )
                region = self._take_region(size, device)
            response, request = self._send(sources, targets, region)
            yield self._read(response, targets, request)
        finally:
            if region is not None:
                try:
                    region.settle()
                finally:
                    if region.device is not None and not self._cuda_regions:
                        # CUDA regions are off (refused, or one could not be made): free this
                        # one's GPU memory, and the free ones', registered or not.
                        self._pool.drop(region)
                        for unused in [region, *self._pool.drop_free_on_gpus()]:
                            self._unregister(unused)
                            unused.destroy()
                    else:
                        self._pool.give_back(region)

    def _configure(self) -> None:
        """Read the served model's configuration once: each binding's tensor in storage order
        (`soagen serve`, `soagen triton`'s Python backend) or in declared order (its PyTorch
        backend), with a batch axis (`max_batch_size` > 0) or without."""
        with self._configure_lock:
            if self._configured:
                return
            cls = type(self)
            grpc_error = self._grpc_error()
            last: Exception | None = None
            for _ in self._attempts():
                try:
                    answer = self._client.get_model_config(
                        self.model_name, as_json=True, client_timeout=self.timeout
                    )
                    break
                except grpc_error as error:
                    if not _is_transient(error):
                        raise RemoteConfigurationError(
                            f"{cls.NAME}: the server at {self.url} does not serve "
                            f"{self.model_name!r}: {_message(error)}"
                        ) from None
                    last = error
            else:
                raise self._unavailable("", last)
            config = answer.get("config", {})
            batched = int(config.get("max_batch_size", 0) or 0) > 0
            served = {
                str(entry.get("name")): entry
                for entry in (*config.get("input", []), *config.get("output", []))
            }
            self._inputs = tuple(
                _served(cls.NAME, self.url, w, served, batched) for w in self._inputs
            )
            self._outputs = tuple(
                _served(cls.NAME, self.url, w, served, batched) for w in self._outputs
            )
            self._error_output = any(
                entry.get("name") == ERROR_OUTPUT for entry in config.get("output", [])
            )
            self._configured = True

    def _take_region(self, size: int, device: torch.device) -> Region:
        """A region for a call on `device`'s data: on that GPU when the client can make CUDA
        regions and the server has not refused them, else in host memory."""
        if device.type == "cuda" and self._cuda_regions is None:
            self._cuda_regions = cuda_shared_memory() is not None
        on_gpu = device.type == "cuda" and bool(self._cuda_regions)
        try:
            region, replaced = self._pool.take(max(size, 1), device if on_gpu else None)
        except Exception as error:
            if not on_gpu:
                raise
            # No GPU memory for it, or cuda-python at odds with the driver: host memory instead.
            self._cuda_regions = False
            self.cuda_shared_memory_refusal = (
                f"a CUDA shared-memory region could not be made: {type(error).__name__}: {error}"
            )
            region, replaced = self._pool.take(max(size, 1), None)
        if replaced is not None:
            self._unregister(replaced)
            replaced.destroy()
        return region

    def _unregister(self, region: Region) -> None:
        if region.registered_in < 0:
            return
        try:
            region.unregister(self._client, self._headers, self.timeout)
        except Exception:
            pass  # a server that lost it has nothing to unregister
        region.registered_in = -1

    def _send(
        self,
        sources: list[Source],
        targets: Sequence[torch.Tensor],
        region: Region | None,
    ) -> tuple[typing.Any, _Request]:
        """Send the request, retrying what is transient; the response and the request it answers."""
        cls = type(self)
        grpc_error = self._grpc_error()
        request: _Request | None = None
        last: Exception | None = None
        start = time.monotonic()
        attempts = 1 + self.retries
        for attempt in self._attempts():
            try:
                if region is not None and not self._register(region):
                    region = None  # refused: the blocks go in the request from now on
                    request = None
                if request is None:
                    request = self._request(sources, targets, region)
                self.stats.add(attempts=1)
                response = self._client.infer(
                    self.model_name,
                    request.inputs,
                    outputs=request.outputs,
                    client_timeout=self.timeout,
                )
                return response, request
            except grpc_error as error:
                text = _message(error)
                if _is_transient(error):
                    last = error
                    self._pool.forget_registrations()
                    continue
                if region is not None and "shared memory region" in text and attempt + 1 < attempts:
                    last = error  # the server forgot the region (it restarted): register again
                    self._pool.forget_registrations()
                    continue
                if "to hold the results" in text:
                    raise RemoteResponseError(
                        f"{cls.NAME} on {self.url}: an output of the model does not fit its output "
                        f"block ({text}); nothing was written"
                    ) from None
                raise RemoteInferenceError(
                    f"{cls.NAME} on {self.url} (model {self.model_name!r}) failed: {text}; "
                    f"nothing was written"
                ) from None
        raise self._unavailable(f" in {time.monotonic() - start:.1f} s", last)

    def _attempts(self) -> Iterator[int]:
        """Attempt numbers, 0 to `retries`; each after the first follows a growing pause and
        counts as a retry."""
        for attempt in range(1 + self.retries):
            if attempt:
                time.sleep(min(_LONGEST_PAUSE_S, _FIRST_PAUSE_S * 2 ** (attempt - 1)))
                self.stats.add(retries=1)
            yield attempt

    def _unavailable(self, took: str, last: Exception | None) -> RemoteUnavailableError:
        attempts = 1 + self.retries
        return RemoteUnavailableError(
            f"{type(self).NAME}: the Triton server at {self.url} did not answer ({attempts} "
            f"attempt{'s' if attempts > 1 else ''}{took}, timeout {self.timeout:g} s each): "
            f"{_message(last) if last is not None else 'no attempt made'}; nothing was written"
            + ("" if self.fallback is not None else "; pass fallback= to run locally instead")
        )

    def _register(self, region: Region) -> bool:
        """Register the region with the server (once per server lifetime); False if the server
        refuses shared memory and this client may send blocks in requests instead."""
        generation = self._pool.generation
        if region.registered_in == generation:
            return True
        grpc_error = self._grpc_error()
        try:
            if region.registered_in >= 0:  # it may still be registered: a name is taken once
                try:
                    region.unregister(self._client, self._headers, self.timeout)
                except grpc_error as error:
                    if _is_transient(error):
                        raise
            region.register(self._client, self._headers, self.timeout)
        except grpc_error as error:
            text = _message(error)
            if _is_transient(error):
                raise
            if region.device is not None:
                # A server without GPU support, or on another host: host memory from now on.
                self._cuda_regions = False
                self.cuda_shared_memory_refusal = text
                return False
            if self.shared_memory_requested:
                hint = (
                    "pass access_token=, the server's token (`soagen serve --token-file`)"
                    if "restricted" in text
                    else "is the server on this host, in the same IPC namespace?"
                )
                raise RemoteConfigurationError(
                    f"{type(self).NAME}: the server at {self.url} refused shared memory ({hint}): "
                    f"{text}"
                ) from None
            self._use_shared_memory = False
            return False
        region.registered_in = generation
        return True

    def _request(
        self, sources: list[Source], targets: Sequence[torch.Tensor], region: Region | None
    ) -> _Request:
        """The request's inputs (each block copied once: into the region, or into its bytes) and
        requested outputs (into the region, after the inputs)."""
        import numpy as np

        grpc = self._grpc
        offset = 0
        request = _Request([], [], [] if region is not None else None)
        copied = shared = to_host = 0
        for source, wire in zip(sources, self._inputs, strict=True):
            on_gpu = not isinstance(source, np.ndarray)  # `_wire_source`: torch for a device
            shape = [int(size) for size in source.shape]
            entry = grpc.InferInput(
                wire.name, [1, *shape] if wire.batched else shape, wire.datatype
            )
            nbytes = block_nbytes(source.shape, wire)
            if region is not None and nbytes:  # Triton takes no empty shared-memory span
                region.write(offset, source, wire)
                entry.set_shared_memory(region.name, nbytes, offset)
                offset += round_up(nbytes, ALIGN)
                shared += nbytes
                copied += nbytes
                to_host += nbytes if on_gpu and region.device is None else 0
            else:
                host, host_copies = _host_array(source, wire)
                # NumPy's tobytes copies the block in wire order; a GPU block was copied to host
                # memory before that (`host_copies`).
                entry.set_data_from_numpy(host[None] if wire.batched else host)
                copied += nbytes * (1 + host_copies)
                to_host += nbytes * host_copies
            request.inputs.append(entry)
        for target, wire in zip(targets, self._outputs, strict=True):
            entry = grpc.InferRequestedOutput(wire.name)
            if request.output_offsets is not None and region is not None:
                nbytes = block_nbytes(target.shape, wire)
                if nbytes:
                    entry.set_shared_memory(region.name, nbytes, offset)
                    request.output_offsets.append(offset)
                    offset += round_up(nbytes, ALIGN)
                else:
                    request.output_offsets.append(None)
            request.outputs.append(entry)
        if self._error_output:
            request.outputs.append(grpc.InferRequestedOutput(ERROR_OUTPUT))  # a few bytes, by gRPC
        if region is not None:
            region.settle()
        request.region = region
        self.stats.add(bytes_copied=copied, bytes_shared=shared, bytes_to_host=to_host)
        return request

    def _read(
        self, response: typing.Any, targets: Sequence[torch.Tensor], request: _Request
    ) -> list[torch.Tensor]:
        """Every output checked (present, datatype, shape) before any is used."""
        import numpy as np

        cls = type(self)
        if self._error_output:
            failure = _event_error(response)
            if failure:
                raise RemoteInferenceError(
                    f"{cls.NAME} on {self.url} (model {self.model_name!r}) failed: {failure}; "
                    f"nothing was written"
                )
        results = []
        for position, (target, wire) in enumerate(zip(targets, self._outputs, strict=True)):
            expected = wire.wire_shape(tuple(target.shape))
            output = response.get_output(wire.name)
            problem = None
            if output is None:
                problem = "is missing from the response"
            elif output.datatype != wire.datatype:
                problem = f"came back as {output.datatype}, the schema declares {wire.datatype}"
            elif tuple(output.shape) != expected:
                wire_axes = ", ".join(wire.axes[axis] for axis in wire.order)
                problem = (
                    f"came back with shape {list(output.shape)}, expected {list(expected)} "
                    f"([{wire_axes}] for an output block of shape {list(target.shape)})"
                )
            if problem is not None:
                raise RemoteResponseError(
                    f"{cls.NAME} output {wire.name!r} from {self.url} {problem}; nothing was "
                    f"written"
                )
            dtype = np.dtype(wire.numpy_dtype)
            array: NDArray[typing.Any] | torch.Tensor | None
            offset = None if request.output_offsets is None else request.output_offsets[position]
            if offset is not None and request.region is not None:
                array = request.region.read(offset, expected, wire)
            else:
                try:
                    array = response.as_numpy(wire.name)
                except ValueError as error:
                    array = None
                    detail = f" ({error})"
                else:
                    detail = ""
                if array is None or array.shape != expected or array.dtype != dtype:
                    raise RemoteResponseError(
                        f"{cls.NAME} output {wire.name!r} from {self.url} does not hold "
                        f"{list(expected)} {wire.numpy_dtype}{detail}; nothing was written"
                    )
            assert array is not None
            results.append(_declared_tensor(array[0] if wire.batched else array, wire))
        return results

    def _grpc_error(self) -> type[Exception]:
        from tritonclient.utils import InferenceServerException

        return typing.cast(type[Exception], InferenceServerException)


def _tritonclient() -> typing.Any:
    try:
        import tritonclient.grpc
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] not in ("tritonclient", "grpc"):
            raise
        raise RemoteConfigurationError(
            "remote models need Triton's gRPC client: pip install 'soagen[serve]' (or "
            "'tritonclient[grpc]')"
        ) from None
    return tritonclient.grpc


@dataclass
class _Request:
    inputs: list[typing.Any]
    outputs: list[typing.Any]
    # Where each output lies in the region (None: in the response, as an empty one always is);
    # None for all: no region.
    output_offsets: list[int | None] | None
    region: Region | None = None


def _served(
    name: str, url: str, wire: WireTensor, served: Mapping[str, typing.Any], batched: bool
) -> WireTensor:
    """The binding's tensor as the server declares it: storage or declared axis order."""
    entry = served.get(wire.name)
    if entry is None:
        raise RemoteConfigurationError(
            f"{name}: the model at {url} has no tensor {wire.name!r} (it has "
            f"{', '.join(served) or 'none'}): is it served for this schema?"
        )
    dims = tuple(int(size) for size in entry.get("dims", []))
    datatype = str(entry.get("data_type", "")).removeprefix("TYPE_")
    candidates = [wire, declared_order(wire)]
    if wire.scalars and wire.direction == "input":
        candidates.append(wire.one_value())  # `soagen triton`'s Python backend: once per event
    for candidate in candidates:
        if candidate.dims == dims and candidate.datatype == datatype:
            return replace(candidate, batched=batched)
    raise RemoteConfigurationError(
        f"{name}: the model at {url} declares {wire.name!r} as {datatype} {list(dims)}; this "
        f"client sends {wire.datatype} {list(wire.dims)} or {list(declared_order(wire).dims)} "
        f"(-1: the elements)"
    )


def _wire_source(collection: Collection, block: BlockSpec, wire: WireTensor) -> Source:
    """The block in wire order, without a copy: NumPy for host memory (read-only collections too),
    torch for a device. A block of scalars the server takes once per event: its one value."""
    import numpy as np

    if collection.device.type == "cpu":
        source: Source = collection.numpy(block).transpose(wire.order)
    else:
        source = collection.block(block).permute(wire.order)
    if not wire.is_one_value:
        return source
    # Stride 0 along n: one element there reads the scalars, even in a collection of none.
    shape = list(source.shape)
    shape[typing.cast(int, wire.element_axis)] = 1
    if isinstance(source, np.ndarray):
        one: Source = np.lib.stride_tricks.as_strided(
            source, shape, source.strides, writeable=False
        )
        return one
    return source.as_strided(shape, source.stride())


def _host_array(source: Source, wire: WireTensor) -> tuple[NDArray[typing.Any], int]:
    """The block as a host NumPy array (wire order, maybe strided) and the copies that took."""
    import numpy as np

    if isinstance(source, np.ndarray):
        return source, 0
    import torch

    from soagen.runtime.buffers import numpy_of

    host = torch.empty(tuple(source.shape), dtype=source.dtype)
    host.copy_(source)
    return numpy_of(host), 1


def _event_error(response: typing.Any) -> str:
    """The error `soagen serve` answered this event with, or "" (see `wire.ERROR_OUTPUT`)."""
    try:
        values = response.as_numpy(ERROR_OUTPUT)
    except Exception:
        values = None
    if values is None or values.size != 1:
        return "its answer has no readable soagen_error output"
    value = values.reshape(-1)[0]
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _declared_tensor(values: NDArray[typing.Any] | torch.Tensor, wire: WireTensor) -> torch.Tensor:
    """An output in wire order (a NumPy array, or a tensor already typed) as a tensor in the
    block's declared axis order (a view)."""
    import numpy as np

    from soagen.runtime.buffers import tensor_of

    tensor = tensor_of(values, wire.dtype) if isinstance(values, np.ndarray) else values
    return tensor.permute(wire.inverse)


def _message(error: Exception) -> str:
    """The server's message; for an error the model's Python code raised (PyTriton sends its whole
    traceback), the last exception's type and message."""
    message = getattr(error, "message", None)
    text = str(message() if callable(message) else error).strip()
    if "Traceback (most recent call last)" not in text:
        return text
    raised = [
        found
        for line in text.splitlines()
        if (found := _EXCEPTION_LINE.match(line.strip())) and found[1] != "TritonModelException"
    ]
    return f"{raised[-1][1]}: {raised[-1][2]}" if raised else text


def _is_transient(error: Exception) -> bool:
    status = getattr(error, "status", None)
    code = str(status() if callable(status) else "")
    # PyTriton answers a guarded API called without its token with UNAVAILABLE too.
    return code in _TRANSIENT and "protocol is restricted" not in _message(error)


def _checked_url(url: object) -> str:
    if not isinstance(url, str) or not url.strip():
        raise RemoteConfigurationError(f"url must be 'host:port' of a gRPC endpoint, got {url!r}")
    text = url.strip()
    for scheme in ("grpc://", "http://", "https://"):
        if text.startswith(scheme):
            if scheme != "grpc://":
                raise RemoteConfigurationError(
                    f"url {url!r}: remote models speak gRPC; give the server's gRPC 'host:port' "
                    f"(soagen serve's --grpc-port, 8001 by default)"
                )
            text = text[len(scheme) :]
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RemoteConfigurationError(f"url {url!r} is not 'host:port' (e.g. '127.0.0.1:8001')")
    return text


def _is_loopback(url: str) -> bool:
    host = url.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _close_quietly(client: typing.Any, pool: RegionPool) -> None:
    destroy_pool(pool)
    try:
        client.close()
    except Exception:
        pass


_remote_classes: dict[type[ModelBinding], type[RemoteBinding]] = {}
_remote_classes_lock = threading.Lock()


def remote_class(cls: type[ModelBinding]) -> type[RemoteBinding]:
    """The generated class with its model run on a server: a subclass, so `isinstance` holds and
    `__call__` is the generated one. Made once per class."""
    with _remote_classes_lock:
        found = _remote_classes.get(cls)
        if found is None:
            found = typing.cast(
                type[RemoteBinding],
                type(
                    cls.__name__,
                    (RemoteBinding, cls),
                    {
                        "__module__": cls.__module__,
                        "__qualname__": f"{cls.__qualname__}.remote",
                        "__doc__": cls.__doc__,
                        "_local_class": cls,
                    },
                ),
            )
            _remote_classes[cls] = found
        return found


def remote_binding(cls: type[_M], url: str, **options: typing.Any) -> _M:
    """What `GeneratedModel.remote(url, **options)` returns; `ModelBinding.remote` documents (and
    types) the options, `RemoteBinding.__init__` checks them."""
    local: type[ModelBinding] = cls
    if issubclass(local, RemoteBinding):
        local = local._local_class
    return typing.cast(_M, remote_class(local)(url, **options))
