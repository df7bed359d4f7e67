"""`soagen compile`: export a model for one of a schema's bindings and compile it with AOTInductor."""

from __future__ import annotations

import argparse
import json
import sys

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
    add_write_outputs_argument,
    command_failed,
    needs_torch,
    parse_pairs,
    path_argument,
    schema_paths,
)
from soagen.dsl.loader import load

HELP = (
    "compile a model ahead of time for its binding: an AOTInductor package (-o FILE.pt2) or an "
    "ONNX file taking the blocks' storage (-o FILE.onnx)"
)
EXAMPLE = (
    "soagen compile schemas/gnn.soa --model EdgeClassifier "
    "--factory examples/gnn_model.py:build_model --device cpu -o edge_classifier.pt2 "
    "--index edge_index=node_features"
)
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, model_help="the model to bind")
    add_factory_argument(parser, required=True)
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda[:INDEX], where it will run (default cpu)"
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=path_argument,
        metavar="FILE.pt2|FILE.onnx",
        help="the package to write; its suffix chooses the format (.onnx: for ONNX Runtime)",
    )
    add_index_argument(
        parser,
        checked="before each run",
        default="the schema's `indexes` clauses and the factory module's INDEX_BOUNDS",
    )
    add_examples_argument(parser)
    add_columnwise_argument(parser)
    add_write_outputs_argument(parser)


def run(args: argparse.Namespace, output: Output) -> int:
    import time

    paths = schema_paths([args.schema])
    if len(paths) != 1:
        raise UsageError("compile takes one .soa file")
    if output.add(load(paths[0])) is None:
        return EXIT_PROBLEMS
    with needs_torch("compile needs torch: pip install 'soagen[torch]'"):
        from soagen.build.compile import compile_model
        from soagen.build.errors import CommandError

    def progress(line: str) -> None:
        print(f"soagen compile: {line}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    if str(args.output).endswith(".onnx"):
        refused = [
            option
            for option, given in (
                ("--columnwise", args.columnwise),
                ("--write-outputs", args.write_outputs),
                (f"--device {args.device}", args.device != "cpu"),
            )
            if given
        ]
        if refused:
            raise UsageError(
                f"{', '.join(refused)}: for .pt2 packages; an ONNX file is exported for the CPU "
                f"(ONNX Runtime chooses its execution provider at load)"
            )
    try:
        if str(args.output).endswith(".onnx"):
            from soagen.build.onnx_export import export_onnx

            path = export_onnx(
                paths[0],
                args.model,
                args.factory,
                output=args.output,
                index_bounds=parse_pairs(args.index, "--index", INDEX_EXAMPLE)
                if args.index
                else None,
                examples=args.examples,
                progress=progress,
            )
        else:
            path = compile_model(
                paths[0],
                args.model,
                args.factory,
                output=args.output,
                device=args.device,
                index_bounds=parse_pairs(args.index, "--index", INDEX_EXAMPLE)
                if args.index
                else None,
                columnwise=args.columnwise,
                write_outputs=args.write_outputs,
                examples=args.examples,
                progress=progress,
            )
    except CommandError as error:
        return command_failed(error, output, usage=error.usage)
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    if output.format == "json":
        report = {"written": path.as_posix(), "model": args.model, "device": args.device}
        print(json.dumps({**report, "bytes": size, "seconds": round(seconds, 1)}))
    else:
        print(
            f"wrote {path.as_posix()} ({args.model} for {args.device}, {size / 1e6:.1f} MB) "
            f"in {seconds:.1f} s"
        )
    return EXIT_OK
