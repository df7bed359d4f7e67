"""Remote calls through `soagen serve` (Triton) against local execution, for the example GNN.

It starts `soagen serve` as a subprocess on free loopback ports (CPU), then times, per edge count n
(nodes = n / 5), the median client-side latency of
- the local binding (`EdgeClassifier(build_model())`, soagen's one-thread CPU setting),
- `EdgeClassifier.remote(url, shared_memory=False)`: blocks copied into the gRPC request,
- `EdgeClassifier.remote(url, shared_memory=True)`: blocks copied into a registered shared-memory
  region, outputs written there by the server,
checks that every remote result equals the local one bit for bit, and reports the input bytes each
request carries and the bytes the client copied (`stats.bytes_copied` per call: the goal is one copy
of each input block). A second table runs many client threads at once at a small n and reads the
server's statistics: how many Triton executions served how many events. Where a CUDA device is
present, a third table sends collections that live on the GPU to a second server whose model runs
on that GPU (`--device cuda`), checks its results against the local GPU run, and counts what the
client copied per request and how much of it went to host memory: zero through a CUDA
shared-memory region (needs `tritonclient[cuda]`), one copy of each block otherwise.

`--servers` measures something else: one client (one remote binding, called from many threads at
once, as a job's streams share one) over 1, 2 and 3 servers, side by side. It starts three servers,
checks that each binding's results equal local execution bit for bit, then times the events per
second each binding delivers (interleaved repeats, medians), their ratios to one server, and how
the three-server binding's requests spread over the servers.

Client and server share the machine (2 cores here): remote timings include the server's work and
its contention with the client, and vary by some 10-20 % from run to run; with `--servers` the
servers also compete with one another for the same cores, so the ratios show the client's overhead
of balancing on such a machine more than what more servers on more machines would give.

Run from the repository root: `python benchmarks/bench_serving.py` (n = 1e3 .. 1e6, ~1-2 minutes),
or `--quick` (n = 1e3, 1e4) for a smoke run; `--servers` (n = 1e3 .. 1e5, ~2 minutes, `--quick`:
n = 1e3).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.timing import samples  # noqa: E402
from examples.gnn_model import build_model  # noqa: E402
from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes  # noqa: E402
from soagen.serving.client import RemoteBinding  # noqa: E402
from tests.helpers import serve_gnn_command, serve_ready  # noqa: E402


def start_server(folder: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, object], str]:
    folder.mkdir(parents=True, exist_ok=True)
    token_file = folder / "token"
    process = subprocess.Popen(
        serve_gnn_command(token_file, *extra),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=(folder / "server.log").open("w"),
        text=True,
        start_new_session=True,
    )
    ready = serve_ready(process)
    if ready is None:
        raise SystemExit(f"soagen serve did not start: see {folder / 'server.log'}")
    return process, ready, token_file.read_text().strip()


def event(edges_n: int, seed: int) -> tuple[Nodes, Edges]:
    nodes_n = max(1, edges_n // 5)
    generator = torch.Generator().manual_seed(seed)
    nodes, edges = Nodes.allocate(nodes_n, zero=True), Edges.allocate(edges_n, zero=True)
    for column in (nodes.x, nodes.y, nodes.z, nodes.energy, edges.delta_r, edges.delta_eta):
        column.copy_(torch.randn(column.shape, generator=generator))
    for column in (edges.src, edges.dst):
        column.copy_(torch.randint(0, nodes_n, column.shape, generator=generator))
    return nodes, edges


def median_ms(action: Callable[[], object], repeats: int) -> float:
    action()  # warm: first placement, region registration
    return statistics.median(samples(action, repeats)) * 1e3


def latency_table(url: str, token: str, sizes: list[int], repeats: int) -> list[str]:
    local = EdgeClassifier(build_model())
    plain = EdgeClassifier.remote(url, shared_memory=False, access_token=token, timeout=60)
    shared = EdgeClassifier.remote(url, shared_memory=True, access_token=token, timeout=60)
    rows = [
        "| n edges | input MB | local ms | gRPC ms | shm ms | gRPC / local | shm / local "
        "| shm Medges/s | copied per request (gRPC, shm) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        nodes, edges = event(n, n)
        expected = EdgeScores.allocate(n, zero=True)
        local(nodes, edges, out=expected)
        times: dict[str, float] = {}
        copied: dict[str, float] = {}
        for name, model in (("local", local), ("grpc", plain), ("shm", shared)):
            out = EdgeScores.allocate(n, zero=True)
            stats = getattr(model, "stats", None)
            calls, nbytes = (stats.calls, stats.bytes_copied) if stats else (0, 0)
            count = max(3, repeats if n <= 100_000 else repeats // 3)
            times[name] = median_ms(functools.partial(model, nodes, edges, out=out), count)
            assert torch.equal(out.score, expected.score), name
            if stats is not None:
                copied[name] = (stats.bytes_copied - nbytes) / (stats.calls - calls)
        input_bytes = nodes.size * 16 + edges.size * 24
        rows.append(
            f"| {n:.0e} | {input_bytes / 1e6:.2f} | {times['local']:.2f} | {times['grpc']:.2f} "
            f"| {times['shm']:.2f} | {times['grpc'] / times['local']:.1f} "
            f"| {times['shm'] / times['local']:.1f} | {n / times['shm'] / 1e3:.2f} "
            f"| {copied['grpc'] / input_bytes:.2f}x, {copied['shm'] / input_bytes:.2f}x |"
        )
        print(rows[-1], flush=True)
    plain.close()
    shared.close()
    return rows


def synchronized(model: EdgeClassifier, nodes: Nodes, edges: Edges, out: EdgeScores) -> None:
    """One call on GPU collections, timed to the end of its GPU work."""
    model(nodes, edges, out=out)
    torch.cuda.synchronize()


def gpu_table(url: str, token: str, sizes: list[int], repeats: int) -> list[str]:
    """Collections on the GPU, sent by a remote binding to a server whose model runs on the same
    GPU (`soagen serve --device cuda`): latency against the local binding on the GPU, and the bytes
    copied per request (all of them, and those to host memory)."""
    local = EdgeClassifier(build_model())
    remote = EdgeClassifier.remote(url, access_token=token, timeout=60)
    assert isinstance(remote, RemoteBinding)
    rows = [
        "| n edges | input MB | local cuda ms | remote ms | remote / local | CUDA shm "
        "| copied per request | of it to host |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        host_nodes, host_edges = event(n, n)
        nodes, edges = host_nodes.to("cuda"), host_edges.to("cuda")
        expected = EdgeScores.allocate(n, device="cuda", zero=True)
        local(nodes, edges, out=expected)
        out = EdgeScores.allocate(n, device="cuda", zero=True)
        count = max(3, repeats if n <= 100_000 else repeats // 3)
        local_ms = median_ms(functools.partial(synchronized, local, nodes, edges, expected), count)
        calls, copied, to_host = (
            remote.stats.calls,
            remote.stats.bytes_copied,
            remote.stats.bytes_to_host,
        )
        remote_ms = median_ms(functools.partial(synchronized, remote, nodes, edges, out), count)
        # The same model on the same GPU; the server's execution may order its reductions
        # otherwise, so a tolerance of a few float32 ulps.
        torch.testing.assert_close(out.score, expected.score, rtol=1e-5, atol=1e-6)
        per_call = max(1, remote.stats.calls - calls)
        input_bytes = nodes.size * 16 + edges.size * 24
        rows.append(
            f"| {n:.0e} | {input_bytes / 1e6:.2f} | {local_ms:.2f} | {remote_ms:.2f} "
            f"| {remote_ms / local_ms:.1f} | {'yes' if remote.uses_cuda_shared_memory else 'no'} "
            f"| {(remote.stats.bytes_copied - copied) / per_call / input_bytes:.2f}x "
            f"| {(remote.stats.bytes_to_host - to_host) / per_call / input_bytes:.2f}x |"
        )
        print(rows[-1], flush=True)
    if remote.cuda_shared_memory_refusal:
        rows.append(f"\nCUDA shared memory refused: {remote.cuda_shared_memory_refusal}")
    remote.close()
    return rows


def concurrency_table(url: str, token: str, n: int, threads: int, per_thread: int) -> list[str]:
    events = [event(n, 10_000 + k) for k in range(threads)]
    rows = [
        "| clients | events | n edges | wall s | events/s | Triton executions | events per execution |",
        "|---|---|---|---|---|---|---|",
    ]
    remote = EdgeClassifier.remote(url, access_token=token, timeout=60)
    assert isinstance(remote, RemoteBinding)
    for nodes, edges in events:  # warm the path
        remote(nodes, edges, out=EdgeScores.allocate(edges.size))
    before = remote.server_statistics()

    def client(k: int) -> None:
        nodes, edges = events[k]
        out = EdgeScores.allocate(edges.size)
        for _ in range(per_thread):
            remote(nodes, edges, out=out)

    workers = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - start
    after = remote.server_statistics()
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    remote.close()
    rows.append(
        f"| {threads} | {inferences} | {n} | {wall:.2f} | {inferences / wall:.0f} | {executions} "
        f"| {inferences / max(executions, 1):.1f} |"
    )
    return rows


def check_results(
    model: EdgeClassifier,
    events: Sequence[tuple[Nodes, Edges]],
    expected: Sequence[torch.Tensor],
    name: str,
) -> None:
    """Each event once through `model`, compared bit for bit with local execution: exits naming
    the first event that differs (before anything is timed)."""
    for k, ((nodes, edges), want) in enumerate(zip(events, expected, strict=True)):
        out = EdgeScores.allocate(edges.size, zero=True)
        out.score.fill_(float("nan"))
        model(nodes, edges, out=out)
        if not torch.equal(out.score, want):
            raise SystemExit(f"{name}: event {k} ({edges.size} edges) differs from local execution")


def stream(model: EdgeClassifier, events: Sequence[tuple[Nodes, Edges]], per_thread: int) -> float:
    """Events per second: a thread per event, each calling `model` `per_thread` times at once."""
    outs = [EdgeScores.allocate(edges.size) for _, edges in events]
    failures: list[BaseException] = []

    def caller(k: int) -> None:
        try:
            for _ in range(per_thread):
                model(*events[k], out=outs[k])
        except BaseException as error:  # re-raised below
            failures.append(error)

    workers = [threading.Thread(target=caller, args=(k,)) for k in range(len(events))]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - start
    if failures:
        raise failures[0]
    return len(events) * per_thread / wall


def servers_table(
    urls: Sequence[str],
    tokens: Sequence[str],
    sizes: list[int],
    threads: int,
    per_thread: int,
    repeats: int,
) -> list[str]:
    """One client over the first 1, 2, ... of the servers: events/s side by side, after checking
    every binding's results against local execution."""
    local = EdgeClassifier(build_model())
    bindings: dict[int, EdgeClassifier] = {}
    for count in range(1, len(urls) + 1):
        address: str | list[str] = urls[0] if count == 1 else list(urls[:count])
        tokens_of = dict(zip(urls[:count], tokens[:count], strict=True))
        bindings[count] = EdgeClassifier.remote(address, access_token=tokens_of, timeout=60)
    most = len(urls)
    widest = bindings[most]
    assert isinstance(widest, RemoteBinding)
    rates_head = " | ".join(f"{count} server{'s' if count > 1 else ''} ev/s" for count in bindings)
    ratios_head = " | ".join(f"{count} / 1" for count in bindings if count > 1)
    rows = [
        f"| n edges | threads | events per run | {rates_head} | {ratios_head} "
        f"| spread over {most} |",
        "|---|---|---|" + "---|" * (2 * most - 1) + "---|",
    ]
    for n in sizes:
        events = [event(n, 20_000 + k) for k in range(threads)]
        expected = []
        for nodes, edges in events:
            out = EdgeScores.allocate(edges.size, zero=True)
            local(nodes, edges, out=out)
            expected.append(out.score.clone())
        for count, remote in bindings.items():
            check_results(remote, events, expected, f"{count} server(s), n = {n}")
        calls = max(2, per_thread if n <= 10_000 else per_thread // 4)
        before = [c.succeeded for c in widest.servers.values()]
        rates: dict[int, list[float]] = {count: [] for count in bindings}
        for _ in range(repeats):  # interleaved: drifts of the machine hit every count alike
            for count, remote in bindings.items():
                rates[count].append(stream(remote, events, calls))
        after = [c.succeeded for c in widest.servers.values()]
        median = {count: statistics.median(taken) for count, taken in rates.items()}
        spread = sum(after) - sum(before)
        shares = "/".join(f"{(b - a) / spread:.0%}" for a, b in zip(before, after, strict=True))
        rows.append(
            f"| {n:.0e} | {threads} | {threads * calls} | "
            + " | ".join(f"{median[count]:.0f}" for count in bindings)
            + " | "
            + " | ".join(f"{median[count] / median[1]:.2f}x" for count in bindings if count > 1)
            + f" | {shares} |"
        )
        print(rows[-1], flush=True)
    for remote in bindings.values():
        remote.close()
    return rows


def servers_mode(quick: bool) -> None:
    count = 3
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as folder:
        with ThreadPoolExecutor(max_workers=count) as pool:
            started = list(pool.map(lambda k: start_server(Path(folder) / f"s{k}"), range(count)))
        try:
            urls = [str(ready["grpc"]) for _, ready, _ in started]
            print(
                f"{count} soagen serve ready at {', '.join(urls)} ({os.cpu_count()} cores here)\n",
                flush=True,
            )
            sizes = [1_000] if quick else [1_000, 10_000, 100_000]
            threads, per_thread, repeats = (6, 4, 2) if quick else (12, 20, 3)
            rows = servers_table(
                urls, [token for _, _, token in started], sizes, threads, per_thread, repeats
            )
            print("\n" + "\n".join(rows))
        finally:
            for process, _, _ in started:
                os.killpg(process.pid, signal.SIGTERM)
            for process, _, _ in started:
                process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e3, 1e4 and few repeats")
    parser.add_argument(
        "--servers",
        action="store_true",
        help="only the throughput of one client over 1, 2 and 3 servers (starts three)",
    )
    options = parser.parse_args()
    if options.servers:
        servers_mode(options.quick)
        return
    sizes = [1_000, 10_000] if options.quick else [1_000, 10_000, 100_000, 1_000_000]
    repeats = 5 if options.quick else 30
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as folder:
        process, ready, token = start_server(Path(folder))
        try:
            url = str(ready["grpc"])
            print(f"soagen serve ready in {ready['seconds']} s at {url}\n", flush=True)
            rows = latency_table(url, token, sizes, repeats)
            print("\n" + "\n".join(rows) + "\n")
            threads, per_thread = (8, 5) if options.quick else (32, 20)
            print("\n".join(concurrency_table(url, token, 1_000, threads, per_thread)))
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(60)
        if not torch.cuda.is_available():
            print("\nNo CUDA device: the GPU table was skipped")
            return
        process, ready, token = start_server(Path(folder) / "cuda", "--device", "cuda")
        try:
            print("\nCollections on the GPU, the server's model on the same GPU:\n")
            print("\n".join(gpu_table(str(ready["grpc"]), token, sizes, repeats)))
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(60)


if __name__ == "__main__":
    main()
