"""Remote model calls: `EdgeClassifier.remote("127.0.0.1:8001")` runs the model on a Triton server.

The object `remote` returns is an instance of the generated class, so its `__call__` is the local
one, typed the same (collections in, `out=` filled, `batch_size=` slices); only the step that runs
the model differs. Per call (per slice with `batch_size`) it sends one request over gRPC holding each
input block once, in its wire form (`soagen.serving.wire`), and waits for the response.

Tensors. At its first call to a server the client reads the served model's configuration and sends
each block as that server declares it: in soagen's wire form, storage order with a batch axis of 1
and bfloat16 as its bits (`soagen serve`, and the Python-backend repositories of `soagen triton` on
any tritonserver; see `soagen.serving.wire`), or in declared order without a batch axis (the
libtorch repositories of `soagen triton --backend pytorch`); a tensor missing or of another shape
or datatype is a `RemoteConfigurationError` before anything is sent.

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
them) are registered once per server and reused across calls: one per call in flight, grown when a
call needs more, unregistered and removed by `close()` (or when the object is collected).
PyTriton's server guards registration with its access token (`access_token=`, which `soagen serve`
writes to `--token-file`; a mapping of URL to token where servers differ); when registration is
refused, or the server cannot open the region (it runs in another container, say), a client that
asked for shared memory by default (`None`) sends that server the blocks in the request instead, and
one that asked for it (`True`) takes the server as refusing the binding (below). A refused CUDA
region is not an error: that call's blocks go in the request, and later calls use host memory.

Several servers. `remote([url, url, ...])` spreads calls over several servers
(`soagen.serving.balancing`): each attempt goes to the server in rotation with the fewest requests
outstanding (ties in turn). A server that fails with a transient error is taken out of rotation,
the call goes on to the next server at once, and a thread probes the server's readiness
`probe_interval` seconds later (doubling the wait after each failed probe, up to 8 times that)
until it is back; a server that answers any attempt is back too. A server that refuses the binding
itself (it does not serve the model or not in a form the binding can send, or refuses the shared
memory the binding requires) is taken out the same way and the call moves on; when every server
refuses, `RemoteConfigurationError` names each (with one server, its own error as before).
`servers` counts, per URL, the attempts sent, succeeded, failed, answered with an error (or
refused) and moved elsewhere, the times it was taken out, whether it is in rotation and the
attempts outstanding; `server_statistics()` adds Triton's own statistics of each. Each server's
model configuration is read at its first attempt, and again after a transient failure (a restarted
server may serve another form), so servers may serve different forms of it (`soagen serve`, a
`soagen triton` repository).

Failures. Each attempt waits at most `timeout` seconds. An unreachable server, a connection lost
mid-request or a timeout is a transient failure: the call moves on to the other servers in
rotation; when none is left untried (with one server, at once), it retries up to `retries` rounds
with a growing pause (50 ms, 100 ms, ... at most 1 s), each over the servers in rotation or, when
none is, the one that failed longest ago (so one server is tried `1 + retries` times, as it always
was). After that the call raises `RemoteUnavailableError` naming every URL and what each failed
with, or, with `fallback=` (a local model), runs the model locally on the same collections. An error a
server answers with (the model raised, an index out of range: the event's own fault) is raised at
once as `RemoteInferenceError`, never sent to another server, and leaves the server in rotation.
Outputs are written only after the whole response is checked (every output present, with the
declared datatype and exactly the output block's shape), so a failed call leaves the output
collections as they were, and each call writes its outputs once: from one server's one validated
response, or from the local fallback. A request that got no answer may still run on its server
later, and write its outputs into its shared-memory region: that region is retired (never handed
to a call again; unregistered from that server `timeout` seconds later, the deadline it was given,
or once the server is back if it is out then) and the call takes a fresh one.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import threading
import time
import typing
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

from soagen.dsl.layout import round_up
from soagen.runtime.backends import Backend, Runner
from soagen.runtime.errors import BindingError
from soagen.runtime.model import ModelBinding
from soagen.serving.balancing import Balancer, Server, ServerCounters
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
# A region's registration with a server that may or may not have taken it (a deadline passed).
_UNKNOWN_GENERATION = -1
_PROBE_TIMEOUT_S = 2.0  # at most, for each readiness call of a probe (and `timeout` at most)
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
        self.urls: tuple[str, ...] = _checked_urls(url)
        # In messages: the one URL, or all of them (`urls` holds them apart).
        self.url = ", ".join(self.urls)
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
        tokens = _checked_tokens(access_token, self.urls)
        if (
            isinstance(probe_interval, bool)
            or not isinstance(probe_interval, (int, float))
            or not 0 < probe_interval < float("inf")
        ):
            raise RemoteConfigurationError(
                f"probe_interval must be a positive number of seconds, got {probe_interval!r}"
            )
        self.timeout = float(timeout)
        self.retries = retries
        self.probe_interval = float(probe_interval)
        self.fallback: ModelBinding | None = fallback
        self.shared_memory_requested = shared_memory
        # Whether a GPU's data goes through CUDA shared memory: None until the first such call.
        self._cuda_regions: bool | None = None
        self.cuda_shared_memory_refusal = ""  # why a server refused it, when one did
        # Everything `run` reads is set as for a local binding; the backend stands in for the server.
        super().__init__(_ServerBackend(self.url, self.model_name), index_bounds=index_bounds)
        # The tensors as the schema has them; each server's configuration picks its form.
        self._wires = _Layout(wire_tensors(cls.INPUTS), wire_tensors(cls.OUTPUTS), False)
        self.stats = RemoteStats()
        self._grpc = _tritonclient()
        servers = [
            Server(
                slot=slot,
                url=address,
                client=self._grpc.InferenceServerClient(
                    address,
                    channel_args=[
                        # A restarted server is found again within a second, not after gRPC's
                        # 2 minutes.
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.min_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 1000),
                    ],
                ),
                headers={_ACCESS_HEADER: token} if token else None,
                shared_memory=shared_memory if shared_memory is not None else _is_loopback(address),
            )
            for slot, (address, token) in enumerate(zip(self.urls, tokens, strict=True))
        ]
        probe_timeout = min(self.timeout, _PROBE_TIMEOUT_S)
        self._balancer = Balancer(
            servers,
            probe_interval=self.probe_interval,
            probe=functools.partial(_probe_ready, self.model_name, probe_timeout),
            unregister=functools.partial(_unregister_region, probe_timeout),
        )
        self._pool = RegionPool()
        self._closed = False
        self._in_flight = 0  # calls between their start and their return, for close()
        self._idle = threading.Condition()
        self._finalizer = weakref.finalize(self, _close_quietly, self._balancer, self._pool)

    @property
    def uses_shared_memory(self) -> bool:
        """Whether the next call sends its blocks through shared memory (to at least one of the
        servers: each accepts or refuses it on its own)."""
        return any(server.shared_memory for server in self._servers)

    @property
    def uses_cuda_shared_memory(self) -> bool | None:
        """Whether calls on a GPU's data send their blocks through CUDA shared memory (else
        through host memory): None before the first such call; False where tritonclient's CUDA
        utilities do not load, or a server refused a region (`cuda_shared_memory_refusal`)."""
        return self._cuda_regions if self.uses_shared_memory else False

    @property
    def servers(self) -> dict[str, ServerCounters]:
        """What this binding has done with each server, by URL, read without asking any server:
        attempts sent, succeeded, failed (transient errors), answered with an error, moved on to
        another server, times taken out of rotation, probes, whether it is in rotation now, and
        the attempts outstanding now (`soagen.serving.balancing.ServerCounters`)."""
        return {counters.url: counters for counters in self._balancer.counters()}

    @property
    def _servers(self) -> tuple[Server, ...]:
        return self._balancer.servers

    @property
    def _client(self) -> typing.Any:
        """The first server's connection (tritonclient's `InferenceServerClient`)."""
        return self._servers[0].client

    def __repr__(self) -> str:
        return f"<{type(self).NAME} on Triton at {self.url} (model {self.model_name!r})>"

    def close(self) -> None:
        """Wait for the calls in flight (from other threads), then stop probing servers,
        unregister and remove the shared-memory regions, close every connection, and close the
        local fallback (its placed runners). Later calls raise `RemoteConfigurationError`."""
        with self._idle:
            if self._closed:
                return
            self._closed = True  # no call starts from here on
            # Calls in flight keep their region and the connections until they return (each is
            # bounded by its timeout and retries).
            self._idle.wait_for(lambda: self._in_flight == 0)
        self._balancer.close(timeout=min(self.timeout, _PROBE_TIMEOUT_S) * 2 + 1)
        if self.fallback is not None:
            self.fallback.close()
        for server in self._servers:
            with self._balancer.lock:
                stale, server.stale = [*server.stale, *server.deferred], []
                server.deferred = []
            regions = [region for region in self._pool.all if server.slot in region.registered]
            for region in [*regions, *stale]:
                try:
                    region.unregister(server.client, server.headers, min(self.timeout, 2.0))
                except Exception as error:
                    if _is_transient(error):
                        break  # the server is gone: its registrations went with it
                    # else it forgot this one (it restarted): the others may still be there
        self._finalizer()

    def server_statistics(self) -> dict[str, typing.Any]:
        """Triton's statistics of the served model (inference and execution counts, queue and
        compute times; PyTriton's server wants `access_token` for them) and, under "servers", this
        binding's counters of each server (`servers`) with, under "model_stats", that server's
        own statistics.

        With one URL, Triton's statistics are the top level, as they always were, and a server
        that does not answer raises `RemoteInferenceError`. With several, the top level holds the
        model's "name" and the sums of "inference_count" and "execution_count" over the servers
        that answered; one that did not has its reason under "statistics_error" instead."""
        servers: dict[str, dict[str, typing.Any]] = {}
        answered: list[dict[str, typing.Any]] = []
        single = len(self._servers) == 1
        for server, counters in zip(self._servers, self._balancer.counters(), strict=True):
            entry: dict[str, typing.Any] = {
                key: value for key, value in asdict(counters).items() if key != "url"
            }
            try:
                entry["model_stats"] = self._model_statistics(server)
                answered.append(entry["model_stats"])
            except RemoteInferenceError as error:
                if single:
                    raise
                entry["statistics_error"] = str(error)
            servers[server.url] = entry
        if single:
            return {**answered[0], "servers": servers}
        return {
            "name": self.model_name,
            "inference_count": sum(int(stats.get("inference_count", 0)) for stats in answered),
            "execution_count": sum(int(stats.get("execution_count", 0)) for stats in answered),
            "servers": servers,
        }

    def _model_statistics(self, server: Server) -> dict[str, typing.Any]:
        try:
            answer = server.client.get_inference_statistics(
                self.model_name, headers=server.headers, as_json=True, client_timeout=self.timeout
            )
        except self._grpc_error() as error:
            raise RemoteInferenceError(
                f"{server.url}: statistics of {self.model_name!r}: {_message(error)}"
            ) from None
        stats: list[dict[str, typing.Any]] = answer.get("model_stats", [])
        if not stats:
            raise RemoteInferenceError(f"{server.url} has no statistics for {self.model_name!r}")
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
        """One server's outputs, checked against the output blocks, as tensors in declared order
        (views of the shared-memory region or of the response, valid inside the block)."""
        call = _Call(type(self), inputs, targets, device)
        try:
            server, response, request = self._send(call)
            try:
                results = self._read(server, response, targets, request)
            except BaseException:
                self._balancer.answered(server, accepted=False)
                raise
            self._balancer.answered(server, accepted=True)
            yield results
        finally:
            if call.region is not None:
                self._release(call.region)

    def _send(self, call: _Call) -> tuple[Server, typing.Any, _Request]:
        """Send the call's request to one server after another until one answers: the server, its
        response and the request it answers.

        Each round tries the servers in rotation, least loaded first; a transient failure takes
        the server out of rotation and the call moves on at once. When no server is in rotation,
        a round tries the one out of rotation that failed longest ago. After a round without an
        answer, up to `retries` more follow, each after a growing pause (50 ms, 100 ms, ... at most
        1 s): with one server, the attempts it always made. An error a server answers with is
        raised at once, from that server."""
        grpc_error = self._grpc_error()
        failures: dict[int, str] = {}  # what each server failed with in this call
        refusals: dict[int, str] = {}  # the servers that refused the binding in this call, why
        attempts = 0
        start = time.monotonic()
        left: Server | None = None  # the server the call failed on last
        for round_number in range(1 + self.retries):
            if round_number:
                pause = _FIRST_PAUSE_S * 2 ** (round_number - 1)
                time.sleep(min(_LONGEST_PAUSE_S, pause))
                self.stats.add(retries=1)
            # A server that refused the binding would refuse again: no later round tries it.
            tried = set(refusals)
            while (
                server := self._balancer.pick(tried, first=not tried - refusals.keys())
            ) is not None:
                tried.add(server.slot)
                if left is not None and left is not server:
                    self._balancer.moved_on(left)
                left = None
                attempts += 1
                try:
                    response, request = self._attempt(server, call)
                except grpc_error as error:
                    if not _is_transient(error):
                        self._balancer.answered(server, accepted=False)
                        raise self._answered_error(server, error) from None
                    failures[server.slot] = _message(error)
                    self._balancer.failed(server, failures[server.slot])
                    if call.region_sent:
                        # The server may still write this request's outputs into the region
                        # (a deadline passed, not the request): no later request reads it.
                        self._retire(call, in_use_on=server)
                    left = server
                    continue
                except RemoteConfigurationError as error:
                    if len(self._servers) == 1:
                        self._balancer.abandoned(server)
                        raise
                    # This server cannot serve the binding; the others may.
                    refusals[server.slot] = str(error).removeprefix(f"{type(self).NAME}: ")
                    self._balancer.refused(server, refusals[server.slot])
                    if len(refusals) == len(self._servers):
                        raise self._refused_by_all(refusals) from None
                    left = server
                    continue
                except BaseException:
                    self._balancer.abandoned(server)
                    if call.region_sent:
                        # The request may still run there and write into the region.
                        self._retire(call, in_use_on=server)
                    raise
                return server, response, request
        raise self._unavailable(attempts, time.monotonic() - start, failures, refusals)

    def _attempt(self, server: Server, call: _Call) -> tuple[typing.Any, _Request]:
        """One attempt on one server: its configuration read (at the first), the region registered
        with it, the request built (once per form: bytes in the request, or a region) and sent."""
        layout = self._configure(server)
        registered_again = False
        while True:
            region = self._region_for(server, call, layout) if server.shared_memory else None
            request = call.request(layout, region)
            if request is None:
                request = self._request(call.sources(layout), call.targets, region, layout)
                call.keep(request)
            self.stats.add(attempts=1)
            call.region_sent = call.region_sent or region is not None
            try:
                response = server.client.infer(
                    self.model_name,
                    request.inputs,
                    outputs=request.outputs,
                    client_timeout=self.timeout,
                )
            except self._grpc_error() as error:
                if (
                    region is not None
                    and not registered_again
                    and not _is_transient(error)
                    and "shared memory region" in _message(error)
                ):
                    # The server forgot the region (it restarted between calls): register again.
                    registered_again = True
                    with self._balancer.lock:
                        server.generation += 1
                    self.stats.add(retries=1)
                    continue
                raise
            return response, request

    def _answered_error(self, server: Server, error: Exception) -> Exception:
        cls = type(self)
        text = _message(error)
        if "to hold the results" in text:
            return RemoteResponseError(
                f"{cls.NAME} on {server.url}: an output of the model does not fit its output "
                f"block ({text}); nothing was written"
            )
        return RemoteInferenceError(
            f"{cls.NAME} on {server.url} (model {self.model_name!r}) failed: {text}; nothing was "
            f"written"
        )

    def _unavailable(
        self,
        attempts: int,
        took: float,
        failures: Mapping[int, str],
        refusals: Mapping[int, str],
    ) -> RemoteUnavailableError:
        name = type(self).NAME
        plural = "s" if attempts != 1 else ""
        each = f"attempt{plural} in {took:.1f} s, timeout {self.timeout:g} s each"
        hint = "" if self.fallback is not None else "; pass fallback= to run locally instead"
        servers = self._servers
        if len(servers) == 1:
            last = failures.get(0) or servers[0].last_error or "no attempt made"
            return RemoteUnavailableError(
                f"{name}: the Triton server at {self.url} did not answer ({attempts} {each}): "
                f"{last}; nothing was written{hint}"
            )
        reasons = "; ".join(
            refusals[server.slot]  # it names the server
            if server.slot in refusals
            else f"{server.url}: "
            + (
                failures[server.slot]
                if server.slot in failures
                else f"out of rotation ({server.last_error or 'not tried'})"
            )
            for server in servers
        )
        return RemoteUnavailableError(
            f"{name}: none of its {len(servers)} Triton servers answered ({attempts} {each}): "
            f"{reasons}; nothing was written{hint}"
        )

    def _refused_by_all(self, reasons: Mapping[int, str]) -> RemoteConfigurationError:
        each = "; ".join(reasons[server.slot] for server in self._servers)
        return RemoteConfigurationError(
            f"{type(self).NAME}: none of its {len(self._servers)} Triton servers can serve its "
            f"calls: {each}; nothing was written"
        )

    def _configure(self, server: Server) -> _Layout:
        """Read the served model's configuration from `server` once: each binding's tensor in
        storage order (`soagen serve`, `soagen triton`'s Python backend) or in declared order (its
        PyTorch backend), with a batch axis (`max_batch_size` > 0) or without. A transient error
        is raised as it is (the attempt failed); any other means the server does not serve it."""
        layout: _Layout | None = server.configuration
        if layout is not None:
            return layout
        with server.configure_lock:
            if server.configuration is not None:
                return typing.cast(_Layout, server.configuration)
            cls = type(self)
            try:
                answer = server.client.get_model_config(
                    self.model_name, as_json=True, client_timeout=self.timeout
                )
            except self._grpc_error() as error:
                if _is_transient(error):
                    raise
                raise RemoteConfigurationError(
                    f"{cls.NAME}: the server at {server.url} does not serve "
                    f"{self.model_name!r}: {_message(error)}"
                ) from None
            config = answer.get("config", {})
            batched = int(config.get("max_batch_size", 0) or 0) > 0
            served = {
                str(entry.get("name")): entry
                for entry in (*config.get("input", []), *config.get("output", []))
            }
            layout = _Layout(
                tuple(
                    _served(cls.NAME, server.url, w, served, batched) for w in self._wires.inputs
                ),
                tuple(
                    _served(cls.NAME, server.url, w, served, batched) for w in self._wires.outputs
                ),
                any(entry.get("name") == ERROR_OUTPUT for entry in config.get("output", [])),
            )
            server.configuration = layout
            return layout

    def _region_for(self, server: Server, call: _Call, layout: _Layout) -> Region | None:
        """The call's region (taken at its first attempt that uses one), registered with
        `server`; None where the server refused it (its blocks then go in the request)."""
        if call.region is None:
            size = sum(
                round_up(block_nbytes(source.shape, wire), ALIGN)
                for source, wire in zip(call.sources(layout), layout.inputs, strict=True)
            )
            size += sum(
                round_up(block_nbytes(target.shape, wire), ALIGN)
                for target, wire in zip(call.targets, layout.outputs, strict=True)
            )
            call.region = self._take_region(size, call.device)
        if not self._register(server, call.region):
            return None
        return call.region

    def _take_region(self, size: int, device: torch.device) -> Region:
        """A region for a call on `device`'s data: on that GPU when the client can make CUDA
        regions and no server has refused them, else in host memory."""
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
            self._discard(replaced)
        return region

    def _release(self, region: Region) -> None:
        """The call's region back to the pool for the next call (or freed, where CUDA regions are
        off now)."""
        try:
            region.settle()
        finally:
            if region.device is not None and not self._cuda_regions:
                # CUDA regions are off (refused, or one could not be made): free this one's GPU
                # memory, and the free ones', registered or not.
                self._pool.drop(region)
                for unused in [region, *self._pool.drop_free_on_gpus()]:
                    self._discard(unused)
            else:
                self._pool.give_back(region)

    def _retire(self, call: _Call, *, in_use_on: Server | None = None) -> None:
        """The call's region, which a request that got no answer used, is never used again; the
        call takes a fresh one if it sends through shared memory again. `in_use_on`: the server
        that request may still be running on."""
        region = call.region
        assert region is not None
        call.region = None
        call.region_sent = False
        call.forget(region)
        self._pool.drop(region)
        self._discard(region, in_use_on=in_use_on)

    def _discard(self, region: Region, *, in_use_on: Server | None = None) -> None:
        """Unregister a region no call will use from the servers it is registered with (those
        out of rotation: once they are back; `in_use_on`, where a request may still use it:
        `timeout` seconds later), and free it here: at once, but for GPU memory `in_use_on` may
        still write into, which goes with the pool."""
        for slot in list(region.registered):
            server = self._servers[slot]
            if server is in_use_on:
                self._balancer.defer(server, region, self.timeout)
            elif not self._balancer.retire(server, region):
                try:
                    region.unregister(server.client, server.headers, min(self.timeout, 2.0))
                except Exception:
                    pass  # a server that lost it has nothing to unregister
        region.registered.clear()
        if in_use_on is not None and region.device is not None:
            self._pool.keep_until_destroyed(region)  # the server may still write into it
        else:
            region.destroy()  # a server's mapping of host memory outlives its name

    def _register(self, server: Server, region: Region) -> bool:
        """Register the region with the server (once per server lifetime); False if the server
        refuses shared memory and this client may send blocks in requests instead."""
        generation = server.generation
        if region.registered.get(server.slot) == generation:
            return True
        grpc_error = self._grpc_error()
        try:
            if server.slot in region.registered:  # it may still be registered: a name is taken once
                try:
                    region.unregister(server.client, server.headers, self.timeout)
                except grpc_error as error:
                    if _is_transient(error):
                        raise
                del region.registered[server.slot]
            region.register(server.client, server.headers, self.timeout)
        except grpc_error as error:
            text = _message(error)
            if _is_transient(error):
                # The server may have registered it after the deadline passed: its next
                # registration there unregisters first.
                region.registered.setdefault(server.slot, _UNKNOWN_GENERATION)
                raise
            if region.device is not None:
                # A server without GPU support, or on another host: host memory from now on.
                self._cuda_regions = False
                self.cuda_shared_memory_refusal = f"{server.url}: {text}"
                return False
            if self.shared_memory_requested:
                if "restricted" in text:
                    hint = "pass access_token=, the server's token (`soagen serve --token-file`)"
                elif "load balancer" in text:
                    # deploy/'s balancers refuse every call a server must take directly.
                    hint = "a load balancer refused it: shared memory needs a direct connection"
                else:
                    hint = "is the server on this host, in the same IPC namespace?"
                raise RemoteConfigurationError(
                    f"{type(self).NAME}: the server at {server.url} refused shared memory "
                    f"({hint}): {text}"
                ) from None
            server.shared_memory = False
            return False
        region.registered[server.slot] = generation
        return True

    def _request(
        self,
        sources: list[Source],
        targets: Sequence[torch.Tensor],
        region: Region | None,
        layout: _Layout,
    ) -> _Request:
        """The request's inputs (each block copied once: into the region, or into its bytes) and
        requested outputs (into the region, after the inputs)."""
        import numpy as np

        grpc = self._grpc
        offset = 0
        request = _Request([], [], [] if region is not None else None, layout)
        copied = shared = to_host = 0
        for source, wire in zip(sources, layout.inputs, strict=True):
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
        for target, wire in zip(targets, layout.outputs, strict=True):
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
        if layout.error_output:
            request.outputs.append(grpc.InferRequestedOutput(ERROR_OUTPUT))  # a few bytes, by gRPC
        if region is not None:
            region.settle()
        request.region = region
        self.stats.add(bytes_copied=copied, bytes_shared=shared, bytes_to_host=to_host)
        return request

    def _read(
        self,
        server: Server,
        response: typing.Any,
        targets: Sequence[torch.Tensor],
        request: _Request,
    ) -> list[torch.Tensor]:
        """Every output checked (present, datatype, shape) before any is used."""
        import numpy as np

        cls = type(self)
        layout = request.layout
        if layout.error_output:
            failure = _event_error(response)
            if failure:
                raise RemoteInferenceError(
                    f"{cls.NAME} on {server.url} (model {self.model_name!r}) failed: {failure}; "
                    f"nothing was written"
                )
        results = []
        for position, (target, wire) in enumerate(zip(targets, layout.outputs, strict=True)):
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
                    f"{cls.NAME} output {wire.name!r} from {server.url} {problem}; nothing was "
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
                        f"{cls.NAME} output {wire.name!r} from {server.url} does not hold "
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


@dataclass(frozen=True)
class _Layout:
    """How one server takes the binding's tensors (its configuration, read at its first call)."""

    inputs: tuple[WireTensor, ...]
    outputs: tuple[WireTensor, ...]
    error_output: bool  # whether it answers failed events in ERROR_OUTPUT


@dataclass
class _Request:
    inputs: list[typing.Any]
    outputs: list[typing.Any]
    # Where each output lies in the region (None: in the response, as an empty one always is);
    # None for all: no region.
    output_offsets: list[int | None] | None
    layout: _Layout
    region: Region | None = None


class _Call:
    """One model run on its way to the servers: its blocks in each wire form asked for, its
    region and the requests built (reused when it moves on to another server)."""

    def __init__(
        self,
        cls: type[RemoteBinding],
        inputs: Mapping[str, Collection],
        targets: Sequence[torch.Tensor],
        device: torch.device,
    ) -> None:
        self.specs = cls.INPUTS
        self.inputs = inputs
        self.targets = targets
        self.device = device
        self.region: Region | None = None
        self.region_sent = False  # whether a request that used the region was sent
        self._sources: dict[tuple[WireTensor, ...], list[Source]] = {}
        self._requests: dict[tuple[_Layout, Region | None], _Request] = {}

    def sources(self, layout: _Layout) -> list[Source]:
        """The input blocks in the layout's wire order (views, no copy)."""
        found = self._sources.get(layout.inputs)
        if found is None:
            found = [
                _wire_source(self.inputs[spec.name], spec.block, wire)
                for spec, wire in zip(self.specs, layout.inputs, strict=True)
            ]
            self._sources[layout.inputs] = found
        return found

    def request(self, layout: _Layout, region: Region | None) -> _Request | None:
        return self._requests.get((layout, region))

    def keep(self, request: _Request) -> None:
        if request.region is not None:
            # The region holds one request's blocks: a request of another form replaces it.
            self.forget(request.region)
        self._requests[(request.layout, request.region)] = request

    def forget(self, region: Region) -> None:
        for key in [key for key in self._requests if key[1] is region]:
            del self._requests[key]


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
    except Exception as error:
        return (
            f"its soagen_error output could not be read ({type(error).__name__}: {error})"
            f"{_all_empty(response)}"
        )
    if values is None:
        return "its answer has no soagen_error output"
    if values.size != 1:
        return f"its soagen_error output holds {values.size} values, not one{_all_empty(response)}"
    value = values.reshape(-1)[0]
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _all_empty(response: typing.Any) -> str:
    """Where every output the response carries is 0 bytes long, what is known to answer so."""
    try:
        contents = list(response.get_response().raw_output_contents)
    except Exception:
        return ""
    if not contents or any(contents):
        return ""
    return (
        "; every output in the answer is empty (0 bytes), as PyTriton 0.7.0 answers when the "
        "server runs it beside NumPy 2: it needs NumPy < 2"
    )


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


def _checked_urls(url: object) -> tuple[str, ...]:
    """One URL, or several (a list or tuple, each server once)."""
    if isinstance(url, str):
        return (_checked_url(url),)
    if not isinstance(url, (list, tuple)) or not url:
        raise RemoteConfigurationError(
            f"url must be 'host:port' of a gRPC endpoint, or a non-empty list of them, got {url!r}"
        )
    checked: list[str] = []
    for position, each in enumerate(url):
        try:
            address = _checked_url(each)
        except RemoteConfigurationError as error:
            raise RemoteConfigurationError(f"urls[{position}]: {error}") from None
        for earlier, known in enumerate(checked):
            if known.lower() == address.lower():
                raise RemoteConfigurationError(
                    f"urls[{position}]: {each!r} is the server of urls[{earlier}] "
                    f"({url[earlier]!r}) again: give each server once"
                )
        checked.append(address)
    return tuple(checked)


def _checked_tokens(token: object, urls: Sequence[str]) -> list[str | None]:
    """Each server's access token: one for all, or one per URL (a mapping; servers it leaves out
    have none)."""
    if token is None:
        return [None] * len(urls)
    if isinstance(token, str):
        if not token:
            raise RemoteConfigurationError("access_token must be a non-empty string or None")
        return [token] * len(urls)
    if not isinstance(token, Mapping):
        raise RemoteConfigurationError(
            "access_token must be a non-empty string, a mapping of URL to token, or None"
        )
    tokens: dict[str, str] = {}
    for key, value in token.items():
        try:
            address = _checked_url(key)
        except RemoteConfigurationError as error:
            raise RemoteConfigurationError(f"access_token: {error}") from None
        matches = [each for each in urls if each.lower() == address.lower()]
        if not matches:
            raise RemoteConfigurationError(
                f"access_token names {key!r}, which is not one of the URLs ({', '.join(urls)})"
            )
        if not isinstance(value, str) or not value:
            raise RemoteConfigurationError(
                f"access_token of {key!r} must be a non-empty string, got {value!r}"
            )
        tokens[matches[0]] = value
    return [tokens.get(each) for each in urls]


def _is_loopback(url: str) -> bool:
    host = url.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _close_quietly(balancer: Balancer, pool: RegionPool) -> None:
    balancer.close()
    destroy_pool(pool)
    for server in balancer.servers:
        try:
            server.client.close()
        except Exception:
            pass


def _probe_ready(model_name: str, timeout: float, server: Server) -> None:
    """Triton's readiness calls: the server, then the model; raises unless both are ready."""
    if not server.client.is_server_ready(headers=server.headers, client_timeout=timeout):
        raise RemoteUnavailableError(f"{server.url} is not ready")
    if not server.client.is_model_ready(model_name, headers=server.headers, client_timeout=timeout):
        raise RemoteUnavailableError(f"{server.url} has no model {model_name!r} ready")


def _unregister_region(timeout: float, server: Server, region: Region) -> None:
    region.unregister(server.client, server.headers, timeout)


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


def remote_binding(cls: type[_M], url: str | Sequence[str], **options: typing.Any) -> _M:
    """What `GeneratedModel.remote(url, **options)` returns; `ModelBinding.remote` documents (and
    types) the options, `RemoteBinding.__init__` checks them."""
    local: type[ModelBinding] = cls
    if issubclass(local, RemoteBinding):
        local = local._local_class
    return typing.cast(_M, remote_class(local)(url, **options))
