"""Two `soagen serve` behind nginx and behind Envoy, each balancer run with the configuration of
`deploy/` as shipped, only its addresses changed (free loopback ports instead of 8001, 8101, 8201).

Calls through a balancer equal local execution bit for bit and reach both servers (their own
statistics, read from each directly with its token, say so); what is per server is refused by the
balancer, and a client that asked for shared memory is told, while one that left it automatic sends
its blocks in the requests; with no server up, calls are gRPC's UNAVAILABLE, which the client
retries and then raises or falls back on; a killed server leaves every call answered by the other,
with no retry by the client. The servers and balancers are started once for the module (about 18 s in all, most of
it starting and stopping the two servers), and the last test kills one of the servers: it runs last.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.deploy.balancers import (
    SERVING,
    Balancer,
    address_of,
    envoy_binary,
    envoy_pointed_at,
    needs_envoy,
    needs_nginx,
    nginx_binary,
    nginx_pointed_at,
    start_envoy,
    start_nginx,
)
from tests.helpers import free_ports
from tests.serving.test_serving import (
    Served,
    _event,
    _expected,
    _forget_model_folders_of,
    _start_server,
    _stop,
    _tritonserver_of,
    needs_triton,
)

torch = pytest.importorskip("torch")

from examples.gnn_model import build_model  # noqa: E402
from generated.gnn import EdgeClassifier, EdgeScores  # noqa: E402
from soagen.serving import (  # noqa: E402
    RemoteConfigurationError,
    RemoteInferenceError,
    RemoteUnavailableError,
)

pytestmark = needs_triton

BALANCERS = [
    pytest.param("nginx", marks=needs_nginx),
    pytest.param("envoy", marks=needs_envoy),
]

# Events of several sizes, 20 calls (so that Envoy's random choice between two idle servers leaves
# neither without a call but once in 500 000 runs); the last request, about 5 MB, is over nginx's
# default body limit.
_SIZES = [(1, 1), (33, 100), (257, 4099), (1000, 5000)] * 5
_SIZES[-1] = (20_000, 200_000)


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Served]]:
    """Two servers, started together."""
    folders = [tmp_path_factory.mktemp(f"backend{k}") for k in range(2)]
    with ThreadPoolExecutor(len(folders)) as pool:
        starts = [pool.submit(_start_server, folder) for folder in folders]
    started = [start.result() for start in starts if start.exception() is None]
    try:
        for start in starts:
            start.result()  # raises what failed, once those started are in `started`
        yield started
    finally:
        with ThreadPoolExecutor(len(started) or 1) as pool:
            list(pool.map(lambda served: _stop(served.process), started))


@pytest.fixture(scope="module")
def balancers(
    backends: list[Served], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Balancer]]:
    """nginx and Envoy, those installed, each on its own port in front of both servers."""
    addresses = [address_of(served.url) for served in backends]
    running: dict[str, Balancer] = {}
    try:
        if nginx_binary() is not None:
            folder = tmp_path_factory.mktemp("nginx")
            listen = ("127.0.0.1", free_ports(1)[0])
            running["nginx"] = start_nginx(
                nginx_pointed_at(folder, listen, addresses), folder, listen
            )
        if envoy_binary() is not None:
            folder = tmp_path_factory.mktemp("envoy")
            listen = ("127.0.0.1", free_ports(1)[0])
            running["envoy"] = start_envoy(
                envoy_pointed_at(folder, listen, addresses), folder, listen
            )
        yield running
    finally:
        for balancer in running.values():
            balancer.stop()


@pytest.fixture(scope="module")
def local() -> EdgeClassifier:
    return EdgeClassifier(build_model())


def _inferences(served: Served) -> int:
    """The server's count of inferences, read from it directly with its token."""
    with EdgeClassifier.remote(served.url, access_token=served.token) as direct:
        return int(direct.server_statistics().get("inference_count", 0))


def _call(remote: EdgeClassifier, local: EdgeClassifier, sizes: tuple[int, int], seed: int) -> None:
    nodes, edges = _event(*sizes, seed)
    out = EdgeScores.allocate(edges.size, zero=True)
    out.score.fill_(-1.0)
    remote(nodes, edges, out=out)
    assert torch.equal(out.score, _expected(local, nodes, edges)), sizes


@pytest.mark.parametrize("name", BALANCERS)
def test_calls_through_the_balancer_equal_local_execution_and_reach_both_servers(
    name: str, balancers: dict[str, Balancer], backends: list[Served], local: EdgeClassifier
) -> None:
    balancer = balancers[name]
    before = [_inferences(served) for served in backends]
    calls = 0
    # What a user passes to a balancer: shared_memory=False (regions are per server).
    with EdgeClassifier.remote(balancer.url, shared_memory=False) as remote:
        for seed, sizes in enumerate(_SIZES):
            _call(remote, local, sizes, seed)
            calls += 1
        stats = remote.stats
        assert (stats.calls, stats.writes, stats.retries, stats.fallbacks) == (calls, calls, 0, 0)
        assert stats.bytes_shared == 0
    received = [_inferences(served) - count for served, count in zip(backends, before, strict=True)]
    assert sum(received) == calls
    assert all(count > 0 for count in received), received  # both servers answered


@pytest.mark.parametrize("name", BALANCERS)
def test_per_server_calls_are_refused_and_shared_memory_is_not_used(
    name: str, balancers: dict[str, Balancer], backends: list[Served], local: EdgeClassifier
) -> None:
    import grpc

    balancer = balancers[name]
    token = backends[0].token  # one server's: the other would refuse it anyway
    with grpc.insecure_channel(balancer.url) as channel:
        assert channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5) == SERVING
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryStatus")(
                b"", timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with EdgeClassifier.remote(balancer.url, access_token=token) as remote:
        with pytest.raises(RemoteInferenceError, match="not through the load balancer"):
            remote.server_statistics()
        # Left automatic, shared memory is tried (the balancer is on a loopback address) and,
        # refused, given up for the requests' bytes.
        assert remote.uses_shared_memory
        _call(remote, local, (40, 80), 1)
        assert not remote.uses_shared_memory and remote.stats.bytes_shared == 0
    with EdgeClassifier.remote(balancer.url, access_token=token, shared_memory=True) as remote:
        with pytest.raises(RemoteConfigurationError, match="a load balancer refused it"):
            _call(remote, local, (40, 80), 1)


@pytest.mark.parametrize("name", BALANCERS)
def test_with_no_server_up_calls_are_unavailable_and_fall_back(
    name: str, tmp_path: Path, local: EdgeClassifier
) -> None:
    """Nothing listens behind the balancer: the client reads gRPC's UNAVAILABLE (not an HTML error
    page), retries, and raises RemoteUnavailableError or runs `fallback=`."""
    listen = ("127.0.0.1", free_ports(1)[0])
    nowhere = [("127.0.0.1", port) for port in free_ports(2)]
    if name == "nginx":
        balancer = start_nginx(
            nginx_pointed_at(tmp_path, listen, nowhere), tmp_path, listen, serving=False
        )
    else:
        balancer = start_envoy(
            envoy_pointed_at(tmp_path, listen, nowhere), tmp_path, listen, serving=False
        )
    try:
        nodes, edges = _event(20, 50, 3)
        out = EdgeScores.allocate(edges.size, zero=True)
        with EdgeClassifier.remote(balancer.url, shared_memory=False, retries=1) as remote:
            with pytest.raises(RemoteUnavailableError, match=balancer.url):
                remote(nodes, edges, out=out)
            assert remote.stats.retries == 1
        with EdgeClassifier.remote(balancer.url, shared_memory=False, fallback=local) as remote:
            remote(nodes, edges, out=out)
            assert (remote.stats.fallbacks, remote.stats.writes) == (1, 0)
        assert torch.equal(out.score, _expected(local, nodes, edges))
    finally:
        balancer.stop()


@pytest.mark.skipif(
    nginx_binary() is None and envoy_binary() is None, reason="neither nginx nor Envoy is installed"
)
def test_a_killed_server_leaves_calls_answered_by_the_other(
    balancers: dict[str, Balancer], backends: list[Served], local: EdgeClassifier
) -> None:
    """Runs last: it kills the first server of the module's two (its tritonserver, as a crash
    would; `soagen serve` then cleans up and exits)."""
    dead, alive = backends
    os.kill(_tritonserver_of(dead.process), signal.SIGKILL)
    assert dead.process.wait(30) == 1
    _forget_model_folders_of(dead)
    for name, balancer in balancers.items():
        before = _inferences(alive)
        # No retry by the client: the balancer alone moves the calls to the live server.
        with EdgeClassifier.remote(balancer.url, shared_memory=False, retries=0) as remote:
            for seed in range(10):
                _call(remote, local, (50 + seed, 300), seed)
            assert remote.stats.writes == 10, name
        assert _inferences(alive) - before == 10, name
