"""`soagen serve`: serve a schema's model with Triton Inference Server until SIGINT or SIGTERM
(torch and PyTriton load only when it runs)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator

from soagen.build.errors import CommandError
from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    INDEX_EXAMPLE,
    Output,
    UsageError,
    add_factory_argument,
    add_index_argument,
    add_model_arguments,
    add_output_size_argument,
    command_failed,
    needs_torch,
    parse_output_sizes,
    parse_pairs,
    path_argument,
)
from soagen.serving.wire import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE_DELAY_US

HELP = (
    "serve a schema's model with Triton Inference Server (NVIDIA PyTriton) until SIGINT or "
    "SIGTERM; clients call Model.remote(url)"
)
EXAMPLE = (
    "soagen serve schemas/gnn.soa --model EdgeClassifier "
    "--factory examples/gnn_model.py:build_model --grpc-port 8001 --token-file token.txt"
)
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(serve: argparse.ArgumentParser) -> None:
    add_model_arguments(
        serve,
        model_help="the model to serve",
        source="source",
        source_help="the .soa file declaring the model (or its generated .py module, or a module "
        "name)",
    )
    given = serve.add_mutually_exclusive_group(required=True)
    add_factory_argument(given)
    given.add_argument(
        "--model-file",
        type=path_argument,
        metavar="FILE",
        help="a TorchScript .pt or an AOTInductor .pt2 from `soagen compile`, or an ONNX .onnx",
    )
    add_output_size_argument(
        serve, when="a model that stores into output blocks (--write-outputs package, ONNX): "
    )
    serve.add_argument(
        "--device", default="cpu", help="cpu or cuda[:INDEX], where the model runs (default cpu)"
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    serve.add_argument("--grpc-port", type=int, default=8001, metavar="PORT", help="default 8001")
    serve.add_argument("--http-port", type=int, default=8000, metavar="PORT", help="default 8000")
    serve.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics (default off)"
    )
    serve.add_argument(
        "--triton-name", metavar="NAME", help="the name clients ask for (default: the model's)"
    )
    add_index_argument(
        serve,
        checked="before each event",
        default="the schema's `indexes` clauses and the factory module's INDEX_BOUNDS",
    )
    serve.add_argument(
        "--max-batch-size",
        type=int,
        default=DEFAULT_MAX_BATCH_SIZE,
        metavar="EVENTS",
        help=f"most events Triton gathers into one execution (default {DEFAULT_MAX_BATCH_SIZE})",
    )
    serve.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=DEFAULT_MAX_QUEUE_DELAY_US,
        metavar="US",
        help="longest wait for more events before an execution starts "
        f"(default {DEFAULT_MAX_QUEUE_DELAY_US})",
    )
    serve.add_argument(
        "--token-file",
        type=path_argument,
        metavar="FILE",
        help="write the access token for shared memory and statistics here (mode 0600)",
    )
    serve.add_argument(
        "--log-file",
        type=path_argument,
        metavar="FILE",
        help="tritonserver's log (default: standard error)",
    )


def run(args: argparse.Namespace, output: Output) -> int:
    try:
        return _serve(args, output)
    except CommandError as error:  # ServeError, or soagen.build.model's own
        return command_failed(error, output, usage=error.usage)


def _serve(args: argparse.Namespace, output: Output) -> int:
    for name in ("grpc_port", "http_port", "metrics_port"):
        port = getattr(args, name)
        if port is not None and not 0 < port < 65536:
            raise UsageError(f"--{name.replace('_', '-')} must be a port number, got {port}")
    if args.source.endswith(".soa"):
        from soagen.dsl.loader import load

        if output.add(load(args.source)) is None:
            return EXIT_PROBLEMS
    with needs_torch("serve needs torch: pip install 'soagen[torch,serve]'"):
        from soagen.serving.server import serve, wait_forever, write_token
    bounds = parse_pairs(args.index, "--index", INDEX_EXAMPLE) if args.index else None

    stop = threading.Event()
    start = time.perf_counter()
    report = sys.stdout
    with _stop_on_signals(stop), contextlib.redirect_stdout(sys.stderr):
        # PyTriton prints tritonserver's log to standard output: it goes to standard error, and
        # standard output keeps this command's own lines.
        server = serve(
            args.source,
            args.model,
            factory=args.factory,
            model_file=args.model_file,
            host=args.host,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            metrics_port=args.metrics_port,
            device=args.device,
            index_bounds=bounds,
            output_sizes=parse_output_sizes(args.output_size),
            triton_model_name=args.triton_name,
            max_batch_size=args.max_batch_size,
            max_queue_delay_us=args.max_queue_delay_us,
            log_file=args.log_file,
        )
        try:
            if args.token_file:
                write_token(args.token_file, server.access_token)
            seconds = time.perf_counter() - start
            ready = {
                "model": server.model_name,
                "grpc": server.grpc_url,
                "http": server.http_url,
                "token_file": args.token_file,
                "pid": os.getpid(),
                "workspace": str(server.workspace),
                "seconds": round(seconds, 1),
            }
            if output.format == "json":
                print(json.dumps(ready), file=report, flush=True)
            else:
                token = f"; access token in {args.token_file}" if args.token_file else ""
                print(
                    f"serving {server.model_name} on {server.grpc_url} (gRPC) and "
                    f"{server.http_url} after {seconds:.1f} s{token}; SIGINT or SIGTERM stops",
                    file=report,
                    flush=True,
                )
            stopped = wait_forever(server, stop)
        finally:
            server.stop()
    if not stopped:
        print("soagen: error: the Triton server stopped by itself", file=sys.stderr)
        return EXIT_PROBLEMS
    print(
        json.dumps({"stopped": True}) if output.format == "json" else "stopped",
        file=report,
        flush=True,
    )
    return EXIT_OK


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` (PyTriton in the background would ignore SIGINT otherwise)."""

    def handler(signum: int, frame: types.FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
