"""`soagen triton`: write a Triton Inference Server model repository entry for a schema's model
(torch loads only when a model file is built)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from soagen.build.errors import CommandError
from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    INDEX_EXAMPLE,
    Output,
    UsageError,
    add_columnwise_argument,
    add_examples_argument,
    add_factory_argument,
    add_index_argument,
    add_model_arguments,
    add_output_size_argument,
    add_write_outputs_argument,
    command_failed,
    parse_output_sizes,
    parse_pairs,
    path_argument,
    schema_paths,
)
from soagen.dsl.loader import load
from soagen.serving.model_config import (
    BACKENDS,
    NAMINGS,
    RUNTIMES,
)
from soagen.serving.wire import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE_DELAY_US

HELP = "write a Triton Inference Server model repository entry for a schema's model"
EXAMPLE = (
    "soagen triton schemas/gnn.soa --model EdgeClassifier "
    "--factory examples/gnn_model.py:build_model --output-size edge_scores=edge_features "
    "-o model_repository"
)
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(triton: argparse.ArgumentParser) -> None:
    add_model_arguments(triton, model_help="the model to serve")
    triton.add_argument(
        "-o",
        "--output",
        required=True,
        type=path_argument,
        metavar="DIR",
        help="the model repository (created if missing); the model goes into DIR/NAME",
    )
    triton.add_argument(
        "--backend",
        choices=BACKENDS,
        default="python",
        help="python: model.py runs soagen's runtime (any --runtime, batching of events); "
        "pytorch: Triton's libtorch backend runs TorchScript; onnxruntime: Triton's onnxruntime "
        "backend runs the --package ONNX model, adapted to the wire form (default python)",
    )
    triton.add_argument(
        "--runtime",
        choices=RUNTIMES,
        help="what the Python backend runs (default: the --package's kind, else eager)",
    )
    add_factory_argument(triton)
    add_examples_argument(triton, when="with --factory: ")
    add_columnwise_argument(triton, when="--runtime aot with --factory: ")
    add_write_outputs_argument(triton, when="--runtime aot with --factory: ")
    triton.add_argument(
        "--package",
        type=path_argument,
        metavar="FILE",
        help="a model file instead of --factory: .pt2 from `soagen compile`, TorchScript .pt, or "
        ".onnx for --backend onnxruntime",
    )
    triton.add_argument("--name", metavar="NAME", help="the Triton model name (default --model)")
    triton.add_argument(
        "--version", type=int, default=1, metavar="N", help="the version folder (default 1)"
    )
    triton.add_argument(
        "--naming",
        choices=NAMINGS,
        help="tensor names: schema (binding names), index (<binding>__<i>), forward (the "
        "forward's argument names); default schema for python, index for pytorch",
    )
    triton.add_argument(
        "--device", choices=("cpu", "gpu"), default="cpu", help="instance kind (default cpu)"
    )
    triton.add_argument(
        "--instances", type=int, default=1, metavar="N", help="instances per device (default 1)"
    )
    triton.add_argument(
        "--gpus", metavar="I,J", help="GPU indices for --device gpu (default: every GPU)"
    )
    triton.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        metavar="N",
        help="python backend: gather up to N events per execution (ragged inputs, dynamic "
        f"batching; default {DEFAULT_MAX_BATCH_SIZE}); the pytorch backend takes one request at "
        "a time",
    )
    triton.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=DEFAULT_MAX_QUEUE_DELAY_US,
        metavar="US",
        help=f"dynamic batching's wait for more requests (default {DEFAULT_MAX_QUEUE_DELAY_US})",
    )
    triton.add_argument(
        "--merge-events",
        action="store_true",
        help="run the gathered events as one concatenation per collection (index inputs shifted); "
        "for models that treat events independently",
    )
    add_output_size_argument(triton, when="python backend: ")
    add_index_argument(
        triton,
        checked="",
        default="the schema's `indexes` clauses and the factory module's INDEX_BOUNDS, or "
        "the package's",
    )


def run(args: argparse.Namespace, output: Output) -> int:
    paths = schema_paths([args.schema])
    if len(paths) != 1:
        raise UsageError("triton takes one .soa file")
    if output.add(load(paths[0])) is None:
        return EXIT_PROBLEMS
    from soagen.serving.repository import Request, write_model

    def progress(line: str) -> None:
        print(f"soagen triton: {line}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    try:
        request = Request(
            schema=paths[0],
            model=args.model,
            repository=Path(args.output),
            backend=args.backend,
            runtime=args.runtime,
            factory=args.factory,
            examples=args.examples,
            columnwise=args.columnwise,
            write_outputs=args.write_outputs,
            package=Path(args.package) if args.package is not None else None,
            name=args.name,
            version=args.version,
            naming=args.naming,
            device=args.device,
            instances=args.instances,
            gpus=_gpus(args.gpus),
            max_batch_size=args.max_batch_size,
            max_queue_delay_us=args.max_queue_delay_us,
            merge_events=args.merge_events,
            output_sizes=parse_output_sizes(args.output_size),
            index_bounds=parse_pairs(args.index, "--index", INDEX_EXAMPLE) if args.index else None,
        )
        written = write_model(request, progress)
    except CommandError as error:  # TritonError, CompileError, soagen.build.model's own
        return command_failed(error, output, usage=error.usage)
    seconds = time.perf_counter() - start
    config = written.config
    if output.format == "json":
        report = {
            "written": written.folder.as_posix(),
            "model": args.model,
            "name": config.name,
            "backend": config.backend,
            "runtime": written.runtime,
            "files": list(written.files),
            "inputs": [t.name for t in config.inputs],
            "outputs": [t.name for t in config.outputs],
            "seconds": round(seconds, 1),
        }
        print(json.dumps(report))
    else:
        how = config.backend + (
            f" backend, {written.runtime} runtime" if written.runtime else " backend"
        )
        print(f"wrote {written.folder.as_posix()} ({how}) in {seconds:.1f} s:")
        generated = [name for name in written.files if "/soagen_generated/" in "/" + name]
        for name in written.files:
            if name not in generated:
                print(f"  {name}")
        if generated:
            # The schema's modules, one line for all of them: what model.py imports.
            folder = generated[0].split("soagen_generated/", 1)[0] + "soagen_generated/"
            print(f"  {folder} ({len(generated)} generated files)")
        tensors = ", ".join(f"{t.name} {list(t.dims)}" for t in config.inputs)
        results = ", ".join(f"{t.name} {list(t.dims)}" for t in config.outputs)
        print(f"  inputs: {tensors}\n  outputs: {results}")
    return EXIT_OK


def _gpus(text: str | None) -> tuple[int, ...]:
    if text is None:
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--gpus takes GPU indices such as 0,1, got {text!r}") from None
