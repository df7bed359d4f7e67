"""`Model.remote([url, url, url])`: one binding over several Triton servers.

The balancer's choice, health and probes are checked first without a server (`Balancer` with
stand-in probes). Then three real `soagen serve` processes on 127.0.0.1 serve the example GNN for
the whole module (`fleet`, started together, on ports of their own so that a killed one restarts on
its port): requests spread over all three, one is killed mid-stream and restarted, and finally all
three die. A test that needs a server a test before it killed restarts it (`Fleet.running`), so
the tests pass in any order; in file order the module starts four servers (three at once, one
restart).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from soagen.serving.balancing import Balancer, Server
from tests.helpers import free_ports

torch = pytest.importorskip("torch")

from examples.gnn_model import build_model  # noqa: E402
from generated.gnn import EdgeClassifier, EdgeScores  # noqa: E402
from soagen.serving import (  # noqa: E402
    RemoteConfigurationError,
    RemoteInferenceError,
    RemoteUnavailableError,
)
from tests.serving.test_serving import (  # noqa: E402
    Served,
    _block_bytes,
    _event,
    _expected,
    _forget_model_folders_of,
    _HoldingProxy,
    _start_server,
    _stop,
    _tritonserver_of,
    needs_triton,
)

_ACCESS_HEADER = "triton-grpc-protocol-triton-access-token"

# The balancer alone: stand-in servers, probes that say what the test wants.


def _balancer(count: int, *, ready: set[int] | None = None, interval: float = 0.05) -> Balancer:
    servers = [Server(slot, f"127.0.0.1:{9000 + slot}", None, None, False) for slot in range(count)]

    def probe(server: Server) -> None:
        if ready is None or server.slot not in ready:
            raise ConnectionError("not ready")

    return Balancer(
        servers, probe_interval=interval, probe=probe, unregister=lambda server, region: None
    )


def test_least_outstanding_wins_and_ties_go_round() -> None:
    balancer = _balancer(3)
    # One caller at a time: every server in turn.
    picks = []
    for _ in range(6):
        server = balancer.pick((), first=True)
        assert server is not None
        picks.append(server.slot)
        balancer.answered(server, accepted=True)
    assert picks == [0, 1, 2, 0, 1, 2]
    # Requests outstanding: the least loaded server, whatever the turn.
    held = [balancer.pick((), first=True) for _ in range(3)]  # one on each
    assert [server.slot for server in held if server] == [0, 1, 2]
    assert held[0] is not None and held[2] is not None
    balancer.answered(held[2], accepted=True)
    balancer.answered(held[0], accepted=True)
    # 0 and 2 idle: 0 is next in turn, then 2 is the least loaded.
    assert [balancer.pick((), first=True).slot for _ in range(2)] == [0, 2]
    # A server the call tried already is not picked again in that round.
    assert balancer.pick({0, 2}, first=False).slot == 1
    assert balancer.pick({0, 1, 2}, first=False) is None
    counts = {c.url[-4:]: (c.sent, c.succeeded, c.outstanding) for c in balancer.counters()}
    assert counts == {"9000": (4, 3, 1), "9001": (4, 2, 2), "9002": (4, 3, 1)}
    balancer.close()


def test_concurrent_picks_spread_and_count_exactly() -> None:
    balancer = _balancer(3)
    barrier = threading.Barrier(12)

    def caller() -> None:
        barrier.wait()
        for _ in range(500):
            server = balancer.pick((), first=True)
            assert server is not None
            time.sleep(0)
            balancer.answered(server, accepted=True)

    threads = [threading.Thread(target=caller) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counters = balancer.counters()
    assert sum(c.succeeded for c in counters) == 6000
    assert all(c.sent == c.succeeded and c.outstanding == 0 for c in counters)
    assert min(c.sent for c in counters) > 1000  # every server took its share
    balancer.close()


def test_a_failed_server_is_out_until_its_probe_passes() -> None:
    ready: set[int] = set()
    balancer = _balancer(2, ready=ready, interval=0.05)
    first = balancer.pick((), first=True)
    assert first is not None and first.slot == 0
    balancer.failed(first, "connection refused")
    # Out of rotation: the other server takes every request.
    assert [balancer.pick((), first=True).slot for _ in range(3)] == [1, 1, 1]
    for _ in range(3):
        balancer.answered(balancer.servers[1], accepted=True)
    deadline = time.monotonic() + 10
    while balancer.servers[0].probes < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    down = balancer.counters()[0]
    assert not down.healthy and down.taken_out == 1 and down.failed == 1
    assert down.probes >= 4 and down.last_error == "probe: not ready"
    # Waits of 0.05, 0.1, 0.2 and 0.4 s: doubling up to 8 x the interval.
    assert balancer.servers[0].wait == pytest.approx(0.4)
    ready.add(0)
    deadline = time.monotonic() + 5
    while not balancer.servers[0].healthy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert balancer.servers[0].healthy
    assert {balancer.pick((), first=True).slot for _ in range(2)} == {0, 1}
    balancer.close(timeout=5)


def test_with_every_server_out_a_round_tries_the_one_that_failed_longest_ago() -> None:
    balancer = _balancer(3, interval=60)
    picked = [balancer.pick((), first=True) for _ in range(3)]
    assert [server.slot for server in picked if server] == [0, 1, 2]
    for slot in (1, 2, 0):
        balancer.failed(balancer.servers[slot], "down")
        time.sleep(0.001)
    assert balancer.pick((), first=False) is None  # not a round's first pick: nothing
    oldest = balancer.pick((), first=True)
    assert oldest is not None and oldest.slot == 1
    assert balancer.pick({1}, first=True).slot == 2
    # An answer puts a server back in rotation at once.
    balancer.answered(oldest, accepted=False)
    assert oldest.healthy and oldest.errors == 1 and oldest.taken_out == 1
    assert balancer.pick((), first=False) is oldest
    balancer.close()


def test_a_probe_begun_before_a_newer_failure_does_not_bring_the_server_back() -> None:
    begun, release = threading.Event(), threading.Event()
    probes = itertools.count()

    def probe(server: Server) -> None:
        if next(probes) == 0:
            begun.set()
            release.wait(10)  # ready, said slowly
            return
        raise ConnectionError("not ready")

    servers = [Server(0, "127.0.0.1:9000", None, None, False)]
    balancer = Balancer(
        servers, probe_interval=0.05, probe=probe, unregister=lambda server, region: None
    )
    server = balancer.pick((), first=True)
    assert server is not None
    balancer.failed(server, "down")
    assert begun.wait(10)
    # While the probe is on its way, a call's attempt (every server out: a round's first pick
    # takes it) fails: that is the newer word on the server.
    assert balancer.pick((), first=True) is server
    balancer.failed(server, "connection refused")
    release.set()
    deadline = time.monotonic() + 10
    while server.probes < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert server.probes >= 1
    assert not server.healthy and server.failed == 2 and server.taken_out == 1
    balancer.close(timeout=5)


def test_a_region_no_call_uses_is_unregistered_now_or_once_its_server_is_back() -> None:
    unregistered: list[tuple[int, str]] = []
    servers = [Server(0, "127.0.0.1:9000", None, None, False)]
    balancer = Balancer(
        servers,
        probe_interval=60,
        probe=lambda server: None,
        unregister=lambda server, region: unregistered.append((server.slot, region)),
    )
    (server,) = servers
    # In rotation: the caller unregisters it at once (decided under the balancer's lock, so a
    # server that comes back meanwhile cannot strand it).
    assert balancer.retire(server, "region-a") is False
    assert server.stale == []
    picked = balancer.pick((), first=True)
    assert picked is server
    balancer.failed(server, "down")
    # Out of rotation: it waits, and the probing thread unregisters it once the server is back.
    assert balancer.retire(server, "region-b") is True
    assert server.stale == ["region-b"] and unregistered == []
    assert balancer.pick((), first=True) is server  # the only server: a round still tries it
    balancer.answered(server, accepted=True)
    deadline = time.monotonic() + 10
    while (not unregistered or balancer._prober is not None) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert unregistered == [(0, "region-b")] and server.stale == []
    assert balancer._prober is None  # every server back and nothing left: the thread ended
    balancer.close()


def test_a_region_a_request_may_still_use_waits_for_its_deadline() -> None:
    unregistered: list[tuple[int, str]] = []
    servers = [Server(slot, f"127.0.0.1:{9000 + slot}", None, None, False) for slot in range(2)]
    balancer = Balancer(
        servers,
        probe_interval=60,
        probe=lambda server: None,
        unregister=lambda server, region: unregistered.append((server.slot, region)),
    )
    up, down = servers

    def settled(server: Server) -> None:
        deadline = time.monotonic() + 10
        while (balancer._timers or server.deferred) and time.monotonic() < deadline:
            time.sleep(0.005)

    # In rotation when the wait is over: unregistered then, not before.
    balancer.defer(up, "region-a", 0.2)
    assert up.deferred == ["region-a"] and unregistered == []
    settled(up)
    assert unregistered == [(0, "region-a")] and up.deferred == []
    # Out of rotation then: kept until the server is back, as a failed server's regions are.
    balancer.failed(balancer.pick({0}, first=True), "down")
    balancer.defer(down, "region-b", 0.1)
    settled(down)
    assert down.stale == ["region-b"] and down.deferred == [] and len(unregistered) == 1
    with balancer.lock:  # an attempt sent to it before it failed ...
        down.outstanding += 1
    balancer.answered(down, accepted=True)  # ... is answered: back in rotation
    deadline = time.monotonic() + 10
    while len(unregistered) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert unregistered[1:] == [(1, "region-b")] and down.stale == []
    # close() stops the waits: what is left in `deferred` is its caller's to unregister.
    balancer.defer(up, "region-c", 0.2)
    balancer.close()
    time.sleep(0.4)
    assert up.deferred == ["region-c"] and len(unregistered) == 2
    assert balancer._timers == set()


class _StandInTriton:
    """Triton's gRPC client as far as a remote binding uses it, over no server: a
    shared-memory manager that takes each name once (a second registration is ALREADY_EXISTS,
    as Triton answers), the binding's own tensors as the served configuration, and faults on
    request: a registration that the server takes after its deadline passed, and an `infer`
    that fails in the client."""

    def __init__(self, remote: Any) -> None:
        self.wires = remote._wires
        self.regions: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.register_after_deadline = False
        self.infer_fault: BaseException | None = None
        self.serves_the_model = True

    def _error(self, text: str, status: str) -> Exception:
        from tritonclient.utils import InferenceServerException

        return InferenceServerException(text, status=f"StatusCode.{status}")

    def get_model_config(self, model_name: str, **_: Any) -> dict[str, Any]:
        if not self.serves_the_model:
            raise self._error(
                f"Request for unknown model: '{model_name}' is not found", "NOT_FOUND"
            )

        def tensors(wires: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": w.name,
                    "dims": [str(d) for d in w.dims],
                    "data_type": f"TYPE_{w.datatype}",
                }
                for w in wires
            ]

        inputs, outputs = tensors(self.wires.inputs), tensors(self.wires.outputs)
        return {"config": {"max_batch_size": 0, "input": inputs, "output": outputs}}

    def register_system_shared_memory(self, name: str, key: str, size: int, **_: Any) -> None:
        self.calls.append(("register", name))
        if name in self.regions:
            raise self._error(f"shared memory region '{name}' already in manager", "ALREADY_EXISTS")
        self.regions.add(name)
        if self.register_after_deadline:
            self.register_after_deadline = False
            raise self._error("Deadline Exceeded", "DEADLINE_EXCEEDED")

    def unregister_system_shared_memory(self, name: str = "", **_: Any) -> None:
        self.calls.append(("unregister", name))
        self.regions.discard(name)

    def infer(self, model_name: str, inputs: Any, **_: Any) -> Any:
        self.calls.append(("infer", ""))
        assert self.infer_fault is not None, "the stand-in answers no request"
        raise self.infer_fault

    def is_server_ready(self, **_: Any) -> bool:
        return True

    def is_model_ready(self, model_name: str, **_: Any) -> bool:
        return self.serves_the_model

    def close(self) -> None:
        pass


def _with_stand_ins(remote: Any) -> list[_StandInTriton]:
    stand_ins = []
    for server in remote._servers:
        server.client.close()
        server.client = _StandInTriton(remote)
        stand_ins.append(server.client)
    return stand_ins


def test_a_registration_whose_deadline_passed_is_unregistered_before_the_next() -> None:
    pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    with EdgeClassifier.remote(["127.0.0.1:1", "127.0.0.1:2"], shared_memory=True) as remote:
        stand_in, _ = _with_stand_ins(remote)
        server = remote._servers[0]
        region = remote._take_region(4096, torch.device("cpu"))
        stand_in.register_after_deadline = True
        with pytest.raises(InferenceServerException, match="Deadline"):
            remote._register(server, region)
        assert region.name in stand_in.regions  # the server took it all the same
        server.generation += 1  # as the failed attempt takes the server out
        # The next registration there unregisters first: no ALREADY_EXISTS, which the binding
        # would read as the server refusing shared memory.
        assert remote._register(server, region)
        assert stand_in.calls == [
            ("register", region.name),
            ("unregister", region.name),
            ("register", region.name),
        ]
        assert server.shared_memory and region.registered == {0: server.generation}
        remote._pool.give_back(region)
    assert stand_in.regions == set()  # close() unregistered it


def test_a_request_cut_short_in_the_client_retires_its_region() -> None:
    pytest.importorskip("tritonclient.grpc")

    class ClientFault(Exception):
        pass

    nodes, edges = _event(10, 20, 5)
    out = EdgeScores.allocate(20, zero=True)
    out.score.fill_(-1.0)
    before = bytes(out.buffer.numpy())
    urls = ["127.0.0.1:1", "127.0.0.1:2"]
    for wait in (True, False):
        remote = EdgeClassifier.remote(urls, shared_memory=True, timeout=1.0)
        stand_ins = _with_stand_ins(remote)
        for stand_in in stand_ins:
            stand_in.infer_fault = ClientFault("interrupted while waiting for the answer")
        with pytest.raises(ClientFault):
            remote(nodes, edges, out=out)
        # The request left with the region: the server may still run it and answer into it, so
        # no later call gets it, and it stays registered there for the request's time limit
        # (unregistering a region in use fails, or worse, on some Triton versions).
        (used,) = [s for s in stand_ins if ("infer", "") in s.calls]
        (name,) = [name for kind, name in used.calls if kind == "register"]
        assert remote._pool.all == [] and not list(Path("/dev/shm").glob(f"{name}*"))
        assert used.regions == {name} and used.calls[-1] == ("infer", "")
        counters = remote.servers
        assert sum(c.errors for c in counters.values()) == 1
        assert all(c.healthy and c.outstanding == 0 for c in counters.values())
        if wait:  # then unregistered by the balancer
            deadline = time.monotonic() + 10
            while used.regions and time.monotonic() < deadline:
                time.sleep(0.01)
            assert used.calls[-1] == ("unregister", name) and used.regions == set()
        remote.close()  # or by close(), where it comes first: the wait ends with it
        assert used.regions == set() and used.calls.count(("unregister", name)) == 1
        time.sleep(0.0 if wait else 1.5)
        assert used.calls.count(("unregister", name)) == 1
    assert bytes(out.buffer.numpy()) == before


def test_gpu_memory_a_request_may_still_write_into_is_freed_with_the_pool() -> None:
    pytest.importorskip("tritonclient.grpc")
    with EdgeClassifier.remote(["127.0.0.1:1", "127.0.0.1:2"], shared_memory=True) as remote:
        stand_in, _ = _with_stand_ins(remote)
        server = remote._servers[0]
        host, gpu = (remote._take_region(4096, torch.device("cpu")) for _ in range(2))
        gpu.device = torch.device("cuda", 0)  # stands for a CUDA region: its destroy frees it
        for region in (host, gpu):
            assert remote._register(server, region)
            remote._pool.drop(region)
            remote._discard(region, in_use_on=server)
        # Host memory goes at once (the server keeps its own mapping); GPU memory stays until
        # the pool goes, at close(), where a late answer would land in memory still the region's.
        assert not Path(f"/dev/shm/{host.name}").exists()
        assert Path(f"/dev/shm/{gpu.name}").exists() and remote._pool.unfreed == [gpu]
        assert stand_in.regions == {host.name, gpu.name}  # both wait for their deadline
    assert not Path(f"/dev/shm/{gpu.name}").exists() and stand_in.regions == set()


def test_later_rounds_skip_a_server_that_refused_the_binding() -> None:
    pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    nodes, edges = _event(10, 20, 6)
    out = EdgeScores.allocate(20, zero=True)
    urls = ["127.0.0.1:1", "127.0.0.1:2"]
    local = EdgeClassifier(build_model())
    for fallback in (None, local):
        remote = EdgeClassifier.remote(
            urls, shared_memory=False, retries=2, probe_interval=60, fallback=fallback
        )
        refusing, down = _with_stand_ins(remote)
        refusing.serves_the_model = False
        down.infer_fault = InferenceServerException(
            "failed to connect to all addresses", status="StatusCode.UNAVAILABLE"
        )
        if fallback is None:
            with pytest.raises(RemoteUnavailableError) as caught:
                remote(nodes, edges, out=out)
            message = str(caught.value)
            assert "none of its 2 Triton servers answered (4 attempts in" in message
            assert (
                "the server at 127.0.0.1:1 does not serve 'EdgeClassifier': Request for unknown "
                "model" in message
            ), message
            assert "127.0.0.1:2: failed to connect to all addresses" in message
            assert message.count("127.0.0.1:1") == 1
        else:
            remote(nodes, edges, out=out)
            assert remote.stats.fallbacks == 1
            assert torch.equal(out.score, _expected(local, nodes, edges))
        # The refusing server was tried once; every round went to the other.
        counters = remote.servers
        assert (counters[urls[0]].sent, counters[urls[1]].sent) == (1, 3)
        assert counters[urls[0]].errors == 1 and counters[urls[1]].failed == 3
        remote.close()


def test_remote_takes_several_urls_each_once() -> None:
    for urls, pattern in (
        ([], "non-empty list"),
        (["127.0.0.1:1", "127.0.0.1"], r"urls\[1\]: url '127\.0\.0\.1' is not 'host:port'"),
        (["127.0.0.1:1", 5], r"urls\[1\]: url must be 'host:port'.*got 5"),
        (["127.0.0.1:1", "http://h:2"], r"urls\[1\]: url 'http://h:2': remote models speak gRPC"),
        (
            ["127.0.0.1:1", "h:2", "grpc://127.0.0.1:1"],
            r"urls\[2\]: 'grpc://127\.0\.0\.1:1' is the server of urls\[0\] \('127\.0\.0\.1:1'\)",
        ),
        (["LOCALHOST:3", "localhost:3"], r"urls\[1\]"),
    ):
        with pytest.raises(RemoteConfigurationError, match=pattern):
            EdgeClassifier.remote(urls)
    urls = ["127.0.0.1:1", "127.0.0.1:2"]
    with pytest.raises(RemoteConfigurationError, match=r"access_token names '127\.0\.0\.1:3'"):
        EdgeClassifier.remote(urls, access_token={"127.0.0.1:3": "t"})
    with pytest.raises(RemoteConfigurationError, match="access_token of '127.0.0.1:2'"):
        EdgeClassifier.remote(urls, access_token={"127.0.0.1:2": ""})
    for interval in (0, -1, float("inf"), True, "1"):
        with pytest.raises(RemoteConfigurationError, match="probe_interval"):
            EdgeClassifier.remote(urls, probe_interval=interval)  # type: ignore[arg-type]
    with EdgeClassifier.remote(
        ("127.0.0.1:1", "grpc://127.0.0.1:2"), access_token={"grpc://127.0.0.1:2": "t"}
    ) as remote:
        assert remote.urls == ("127.0.0.1:1", "127.0.0.1:2")
        assert [server.headers for server in remote._servers] == [None, {_ACCESS_HEADER: "t"}]
        assert list(remote.servers) == list(remote.urls)
        assert "127.0.0.1:1, 127.0.0.1:2" in repr(remote)


@needs_triton
def test_when_no_server_answers_the_error_names_each_or_the_fallback_runs() -> None:
    urls = [f"127.0.0.1:{port}" for port in free_ports(3)]  # nothing listens there
    nodes, edges = _event(30, 60, 8)
    out = EdgeScores.allocate(60, zero=True)
    out.score.fill_(-1.0)
    before = bytes(out.buffer.numpy())
    with EdgeClassifier.remote(urls, timeout=2, retries=1, probe_interval=60) as remote:
        with pytest.raises(RemoteUnavailableError) as caught:
            remote(nodes, edges, out=out)
        message = str(caught.value)
        # Round 1 tries all three, round 2 the one that failed longest ago.
        assert "none of its 3 Triton servers answered (4 attempts in" in message
        for url in urls:
            assert f"{url}: failed to connect to all addresses" in message
        assert message.endswith("; nothing was written; pass fallback= to run locally instead")
        assert remote.stats.retries == 1
        counters = remote.servers
        assert [counters[url].sent for url in urls] == [2, 1, 1]
        assert not any(counters[url].healthy for url in urls)
        # Known to be down, each round still tries one (the one that failed longest ago).
        with pytest.raises(RemoteUnavailableError, match="2 attempts"):
            remote(nodes, edges, out=out)
    assert bytes(out.buffer.numpy()) == before
    local = EdgeClassifier(build_model())
    with EdgeClassifier.remote(urls, retries=0, fallback=local) as remote:
        remote(nodes, edges, out=out)
        assert (remote.stats.fallbacks, remote.stats.writes) == (1, 0)
        assert [counters.sent for counters in remote.servers.values()] == [1, 1, 1]
    assert torch.equal(out.score, _expected(local, nodes, edges))


# Three real servers.


class Fleet:
    """`count` servers of `soagen serve` on ports of their own, started together; a killed one
    restarts on its ports."""

    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        ports = free_ports(2 * count)
        self.ports = [(ports[2 * k], ports[2 * k + 1]) for k in range(count)]
        self.served: list[Served | None] = [None] * count
        self._starts = itertools.count()

    def _start(self, k: int) -> Served:
        folder = self.folder / f"server{k}-{next(self._starts)}"
        folder.mkdir()
        grpc_port, http_port = self.ports[k]
        served = _start_server(folder, "--grpc-port", str(grpc_port), "--http-port", str(http_port))
        assert served.url == f"127.0.0.1:{grpc_port}"
        self.served[k] = served
        return served

    def running(self) -> list[Served]:
        """Every server, those that are down started again (together)."""
        down = [k for k, s in enumerate(self.served) if s is None or s.process.poll() is not None]
        with ThreadPoolExecutor(max_workers=max(1, len(down))) as pool:
            for result in [pool.submit(self._start, k) for k in down]:
                result.result()
        return [served for served in self.served if served is not None]

    def kill(self, *ks: int) -> None:
        """Kill the servers' tritonserver (as a crash would); `soagen serve` sees it go."""
        killed = [self.served[k] for k in ks]
        for served in killed:
            assert served is not None
            os.kill(_tritonserver_of(served.process), signal.SIGKILL)
        for served in killed:
            assert served is not None
            assert served.process.wait(30) == 1
            _forget_model_folders_of(served)

    @property
    def urls(self) -> list[str]:
        return [f"127.0.0.1:{grpc_port}" for grpc_port, _ in self.ports]

    def tokens(self) -> dict[str, str]:
        return {s.url: s.token for s in self.served if s is not None}

    def stop(self) -> None:
        with ThreadPoolExecutor(max_workers=len(self.served)) as pool:
            for served in self.served:
                if served is not None:
                    pool.submit(_stop, served.process)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), 3)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def local() -> EdgeClassifier:
    return EdgeClassifier(build_model())


def _registered(url: str, token: str, prefix: str) -> list[str]:
    import tritonclient.grpc

    client = tritonclient.grpc.InferenceServerClient(url)
    try:
        status = client.get_system_shared_memory_status(
            headers={_ACCESS_HEADER: token}, as_json=True
        )
    finally:
        client.close()
    return [name for name in status.get("regions", {}) if name.startswith(prefix)]


@needs_triton
def test_requests_spread_over_every_server(fleet: Fleet, local: EdgeClassifier) -> None:
    fleet.running()
    urls, tokens = fleet.urls, fleet.tokens()
    remote = EdgeClassifier.remote(urls, access_token=tokens)
    assert remote.uses_shared_memory  # loopback: each server gets its own registrations
    before = remote.server_statistics()
    assert set(before["servers"]) == set(urls)
    events = [_event(20 + k % 5, 40 + 3 * k, 300 + k) for k in range(48)]
    outs = [EdgeScores.allocate(edges.size, zero=True) for _, edges in events]
    # One thread first: its calls never overlap, so they go round the servers in turn.
    for k in range(6):
        remote(*events[k], out=outs[k])
    assert [remote.servers[url].succeeded for url in urls] == [2, 2, 2]
    errors: list[BaseException] = []

    def client(first: int) -> None:
        try:
            for k in range(first, len(events), 6):
                remote(*events[k], out=outs[k])
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=client, args=(first,)) for first in range(6, 12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for (nodes, edges), out in zip(events, outs, strict=True):
        assert torch.equal(out.score, _expected(local, nodes, edges))
    counters = remote.servers
    assert all(counters[url].succeeded > 2 for url in urls), counters
    assert sum(counters[url].succeeded for url in urls) == len(events) == remote.stats.writes
    for url in urls:
        entry = counters[url]
        assert entry.healthy and entry.outstanding == 0 and entry.sent == entry.succeeded
        assert (entry.failed, entry.errors, entry.taken_out, entry.retried_elsewhere) == (
            0,
            0,
            0,
            0,
        )
    # Triton's own counts, per server and summed, agree with the client's.
    after = remote.server_statistics()
    for url in urls:
        served = int(after["servers"][url]["model_stats"]["inference_count"]) - int(
            before["servers"][url]["model_stats"].get("inference_count", 0)
        )
        assert served == counters[url].succeeded
        assert after["servers"][url]["succeeded"] == counters[url].succeeded
    assert after["inference_count"] - before["inference_count"] == len(events)
    # Every server holds this client's regions; close() unregisters them everywhere, removes
    # them, and closes every connection.
    prefix = remote._pool.prefix
    assert all(_registered(url, tokens[url], prefix) for url in urls)
    remote.close()
    assert not any(_registered(url, tokens[url], prefix) for url in urls)
    assert not list(Path("/dev/shm").glob(f"{prefix}*"))
    for server in remote._servers:
        with pytest.raises(Exception, match="closed"):
            server.client.is_server_live()


@needs_triton
@pytest.mark.parametrize("shared_memory", [False, None], ids=["grpc", "shared-memory"])
def test_an_error_of_the_event_is_not_sent_elsewhere(
    fleet: Fleet, shared_memory: bool | None
) -> None:
    fleet.running()
    nodes, edges = _event(10, 20, 3)
    edges.src[5] = 99  # not a node; the client's own check is off, so that the server answers
    out = EdgeScores.allocate(20, zero=True)
    out.score.fill_(-1.0)
    before = bytes(out.buffer.numpy())
    with EdgeClassifier.remote(
        fleet.urls,
        access_token=fleet.tokens(),
        shared_memory=shared_memory,
        index_bounds={"edge_index": None},
    ) as remote:
        with pytest.raises(RemoteInferenceError, match="IndexRangeError") as caught:
            remote(nodes, edges, out=out)
        (answered,) = [url for url in fleet.urls if url in str(caught.value)]
        assert (remote.stats.attempts, remote.stats.retries) == (1, 0)
        counters = remote.servers
        assert counters[answered].errors == 1
        assert all(
            c.healthy and c.failed == 0 and c.retried_elsewhere == 0 for c in counters.values()
        )
        assert sum(c.sent for c in counters.values()) == 1
    assert bytes(out.buffer.numpy()) == before


@needs_triton
def test_a_server_that_refuses_the_binding_is_taken_out_and_calls_go_to_the_others(
    fleet: Fleet, local: EdgeClassifier
) -> None:
    fleet.running()
    urls, tokens = fleet.urls, fleet.tokens()
    refusing = urls[0]  # the first in turn: the first call meets it
    # Shared memory required, and a wrong token for one server: that server refuses every
    # registration this binding makes. It answers readiness probes, so a short interval would
    # bring it back for a call to meet again; 60 s keeps it out for the test.
    wrong = {**tokens, refusing: "not-the-token"}
    events = [_event(15 + k % 4, 30 + k, 3000 + k) for k in range(9)]
    outs = [EdgeScores.allocate(edges.size, zero=True) for _, edges in events]
    with EdgeClassifier.remote(
        urls, access_token=wrong, shared_memory=True, probe_interval=60
    ) as remote:
        for event, out in zip(events, outs, strict=True):
            remote(*event, out=out)
        counters = remote.servers
        out_of_rotation = counters[refusing]
        assert not out_of_rotation.healthy and out_of_rotation.taken_out == 1
        assert (out_of_rotation.sent, out_of_rotation.errors, out_of_rotation.succeeded) == (
            1,
            1,
            0,
        )
        assert out_of_rotation.retried_elsewhere == 1
        assert "refused shared memory" in out_of_rotation.last_error
        assert [counters[url].succeeded for url in urls[1:]] == [5, 4]
        assert remote.stats.writes == len(events) and remote.stats.fallbacks == 0
    for (nodes, edges), out in zip(events, outs, strict=True):
        assert torch.equal(out.score, _expected(local, nodes, edges))
    # When every server refuses, the call raises naming each, and writes nothing; so it does
    # for a model no server serves. The fallback is for servers that do not answer, not for a
    # binding the servers cannot serve.
    nodes, edges = events[0]
    out = EdgeScores.allocate(edges.size, zero=True)
    out.score.fill_(-1.0)
    before = bytes(out.buffer.numpy())
    for options, reason in (
        (
            {"access_token": dict.fromkeys(urls, "not-the-token"), "shared_memory": True},
            "refused shared memory",
        ),
        ({"model_name": "NoSuchModel"}, "does not serve 'NoSuchModel'"),
    ):
        with EdgeClassifier.remote(urls, fallback=local, **options) as remote:  # type: ignore[arg-type]
            with pytest.raises(RemoteConfigurationError) as caught:
                remote(nodes, edges, out=out)
            message = str(caught.value)
            assert message.startswith(
                "EdgeClassifier: none of its 3 Triton servers can serve its calls: the server at "
            ), message
            assert message.endswith("; nothing was written")
            for url in urls:
                assert f"the server at {url} " in message
            assert message.count(reason) == 3
            assert remote.stats.fallbacks == 0
            assert not any(c.healthy for c in remote.servers.values())
    assert bytes(out.buffer.numpy()) == before


@needs_triton
def test_a_server_killed_mid_stream_loses_no_event_and_comes_back(
    fleet: Fleet, local: EdgeClassifier
) -> None:
    fleet.running()
    urls = fleet.urls
    victim = urls[1]
    interval = 0.25
    remote = EdgeClassifier.remote(
        urls, access_token=fleet.tokens(), timeout=5, retries=1, probe_interval=interval
    )
    events = [_event(20 + k % 7, 50 + k, 1000 + k) for k in range(90)]
    outs = [EdgeScores.allocate(edges.size, zero=True) for _, edges in events]
    for out in outs:
        out.score.fill_(-1.0)
    done = [0]
    lock = threading.Lock()
    killed = threading.Event()
    errors: list[BaseException] = []

    def client(first: int) -> None:
        try:
            for k in range(first, len(events), 4):
                if k >= 60:
                    killed.wait(60)  # the last events come after the kill, whatever the timing
                remote(*events[k], out=outs[k])
                with lock:
                    done[0] += 1
        except BaseException as error:  # reported below
            errors.append(error)

    def kill() -> None:
        while done[0] < 20 and not errors:
            time.sleep(0.001)
        fleet.kill(1)  # while calls stream from four threads (some are likely on it)
        killed.set()

    threads = [threading.Thread(target=client, args=(first,)) for first in range(4)]
    killer = threading.Thread(target=kill)
    for thread in (*threads, killer):
        thread.start()
    for thread in (*threads, killer):
        thread.join(120)
    assert not errors, errors
    # Every event was answered once, by a server (no fallback is configured), bit for bit as the
    # local model computes it.
    assert (remote.stats.writes, remote.stats.fallbacks) == (len(events), 0)
    for (nodes, edges), out in zip(events, outs, strict=True):
        assert torch.equal(out.score, _expected(local, nodes, edges))
    counters = remote.servers
    assert sum(c.succeeded for c in counters.values()) == len(events)
    dead = counters[victim]
    assert not dead.healthy and dead.taken_out == 1 and dead.failed >= 1
    assert dead.retried_elsewhere == dead.failed  # each call it failed went on elsewhere
    assert dead.outstanding == 0 and dead.last_error
    assert all(counters[url].healthy for url in urls if url != victim)
    statistics = remote.server_statistics()  # the dead server's statistics: its reason
    assert "statistics_error" in statistics["servers"][victim]
    assert statistics["servers"][victim]["healthy"] is False

    # Restarted on its port, it is probed back into rotation, and used again.
    fleet.running()
    restarted = time.monotonic()
    while not remote.servers[victim].healthy and time.monotonic() < restarted + 30:
        time.sleep(0.01)
    back_after = time.monotonic() - restarted
    assert remote.servers[victim].healthy
    # The probe waits double after each failure, up to 8 x the interval: back within about that
    # (and the channel's reconnection, at most 1 s).
    assert back_after < 2 * 8 * interval + 1.5, back_after
    assert remote.servers[victim].probes >= 1
    used = remote.servers[victim].succeeded
    for (nodes, edges), out in zip(events[:6], outs[:6], strict=True):
        out.score.fill_(-1.0)
        remote(nodes, edges, out=out)
        assert torch.equal(out.score, _expected(local, nodes, edges))
    assert remote.servers[victim].succeeded == used + 2
    # The restarted server made a new access token, which this binding does not have: it refused
    # the binding's regions, and takes the blocks in its requests; the others still share memory.
    assert [server.shared_memory for server in remote._servers] == [True, False, True]
    remote.close()


def _held_first(
    fleet: Fleet, held: int, other: int, *, late: bool = False, **options: Any
) -> tuple[_HoldingProxy, EdgeClassifier]:
    """Servers `held` and `other` running, a proxy in front of `held` that holds the first request
    (`_HoldingProxy`), and a remote binding over the proxy, then `other`: the first call goes to
    the proxy (its turn)."""
    served = fleet.running()
    proxy = _HoldingProxy(served[held].url, hold=1, late=late)
    remote = EdgeClassifier.remote(
        [proxy.url, served[other].url],
        access_token={proxy.url: served[held].token, served[other].url: served[other].token},
        **options,
    )
    return proxy, remote


@needs_triton
def test_a_request_on_a_server_when_it_is_killed_is_answered_by_another(
    fleet: Fleet, local: EdgeClassifier
) -> None:
    """The request is in flight when its server dies: held at a proxy in front of the server, whose
    connection is then cut mid-call (the proxy stops, as a dying server's sockets close) after the
    server is killed. It goes on to the other server, answered once, bit for bit as the local
    model computes it, and the dead one is taken out."""
    proxy, remote = _held_first(fleet, 1, 2, timeout=10, retries=1, probe_interval=0.25)
    victim, other = remote.urls
    errors: list[BaseException] = []

    def call() -> None:
        try:
            remote(nodes, edges, out=out)  # to the proxy first (its turn)
        except BaseException as error:  # reported below
            errors.append(error)

    try:
        nodes, edges = _event(40, 300, 71)
        out = EdgeScores.allocate(edges.size, zero=True)
        out.score.fill_(-1.0)
        caller = threading.Thread(target=call)
        caller.start()
        proxy.wait_held(1)
        fleet.kill(1)
        proxy._server.stop(grace=None)  # the held call's connection goes, the call unanswered
        caller.join(60)
        assert not caller.is_alive() and not errors, errors
        assert proxy.outcomes(1) == ["abandoned"]  # never forwarded
        counters = remote.servers
        assert (counters[victim].failed, counters[victim].retried_elsewhere) == (1, 1)
        assert not counters[victim].healthy and counters[victim].taken_out == 1
        assert counters[other].succeeded == 1
        assert (remote.stats.writes, remote.stats.fallbacks) == (1, 0)
        assert torch.equal(out.score, _expected(local, nodes, edges))
    finally:
        remote.close()
        proxy.close()


@needs_triton
def test_a_request_answered_after_its_deadline_writes_into_no_later_call(
    fleet: Fleet, local: EdgeClassifier
) -> None:
    """A server that runs a request after its caller gave up (the deadline passed) still writes
    the outputs into the call's shared-memory region. That region is retired: the call goes on to
    another server with a fresh one, and no later call is handed the old one; the slow server is
    probed back into rotation, and the retired region unregistered there once the deadline has
    passed once more (the request may still be running)."""
    proxy, remote = _held_first(fleet, 0, 1, late=True, timeout=1.5, retries=0, probe_interval=0.2)
    slow, other = remote.urls
    served = fleet.served
    try:
        events = [_event(40, 300, 61 + k) for k in range(3)]  # one size: one region fits all
        outs = [EdgeScores.allocate(300, zero=True) for _ in events]
        remote(*events[0], out=outs[0])  # to the proxy first (its turn), held past the deadline
        assert proxy.outcomes(1) == ["abandoned"]
        counters = remote.servers
        assert (counters[slow].failed, counters[slow].retried_elsewhere) == (1, 1)
        assert counters[other].succeeded == 1
        # Its blocks were copied twice: into the region the abandoned request used, then into a
        # fresh one for the other server.
        assert remote.stats.bytes_copied == 2 * _block_bytes(*events[0])
        with proxy.arrived:  # the server has run the abandoned request, and written its outputs
            assert proxy.arrived.wait_for(lambda: proxy.late_answers == 1, 30)
        prefix = remote._pool.prefix
        assert len(list(Path("/dev/shm").glob(f"{prefix}*"))) == 1  # the retired one is gone
        deadline = time.monotonic() + 30
        waiting = remote._servers[0]
        while (not waiting.healthy or waiting.stale or waiting.deferred) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)
        assert remote.servers[slow].healthy and remote.servers[slow].probes >= 1
        pooled = {region.name for region in remote._pool.all}
        # The balancer takes the retired region off its lists, then unregisters it outside its
        # lock.
        registered = set(_registered(served[0].url, served[0].token, prefix))
        while not registered <= pooled and time.monotonic() < deadline:
            time.sleep(0.01)
            registered = set(_registered(served[0].url, served[0].token, prefix))
        assert registered <= pooled
        for event, out in zip(events[1:], outs[1:], strict=True):
            remote(*event, out=out)  # one each: the region the first call ended with
        assert remote.servers[slow].succeeded == 1
        for (nodes, edges), out in zip(events, outs, strict=True):
            assert torch.equal(out.score, _expected(local, nodes, edges))
    finally:
        remote.close()
        proxy.close()


@needs_triton
def test_all_servers_killed_fall_back_then_raise_naming_each(
    fleet: Fleet, local: EdgeClassifier
) -> None:
    fleet.running()
    urls = fleet.urls
    remote = EdgeClassifier.remote(
        urls, access_token=fleet.tokens(), timeout=5, retries=1, fallback=local, probe_interval=60
    )
    events = [_event(30, 60 + k, 2000 + k) for k in range(6)]
    outs = [EdgeScores.allocate(edges.size, zero=True) for _, edges in events]
    for k in range(3):
        remote(*events[k], out=outs[k])
    assert remote.stats.writes == 3
    fleet.kill(0, 1, 2)
    for k in range(3, 6):
        remote(*events[k], out=outs[k])
    assert (remote.stats.writes, remote.stats.fallbacks) == (3, 3)
    for (nodes, edges), out in zip(events, outs, strict=True):
        assert torch.equal(out.score, _expected(local, nodes, edges))
    assert not any(c.healthy for c in remote.servers.values())
    remote.close()
    # Without a fallback: every URL and what it failed with.
    nodes, edges = events[0]
    out = EdgeScores.allocate(edges.size, zero=True)
    with EdgeClassifier.remote(urls, timeout=5, retries=0) as bare:
        with pytest.raises(RemoteUnavailableError) as caught:
            bare(nodes, edges, out=out)
    for url in urls:
        assert f"{url}: failed to connect to all addresses" in str(caught.value)
