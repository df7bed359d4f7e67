"""The `soagen` entry point: the argument parser built from the command modules, and dispatch.

Exit codes: 0 success, 1 schema errors or stale generated files, 2 usage errors (bad arguments,
missing paths). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import soagen
from soagen.cli import (
    breaking,
    check,
    completion,
    explain,
    fmt,
    generate,
    import_cmssw,
    lint,
    serve,
    show,
    triton,
)
from soagen.cli import compile as compile_command
from soagen.cli.common import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, Command, Output, UsageError

# In `soagen --help`'s order.
COMMANDS: dict[str, Command] = {
    "generate": generate,
    "show": show,
    "check": check,
    "explain": explain,
    "compile": compile_command,
    "lint": lint,
    "fmt": fmt,
    "breaking": breaking,
    "import-cmssw": import_cmssw,
    "completion": completion,
    "triton": triton,
    "serve": serve,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="soagen",
        description="Structure-of-Arrays schemas for PyTorch: CMSSW-compatible layouts and zero-copy "
        "tensor views.",
        epilog="examples:\n  " + "\n  ".join(command.EXAMPLE for command in COMMANDS.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"soagen {soagen.__version__}")
    # `soagen completion` reads the whole parser.
    parser.set_defaults(root_parser=parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(
            name,
            help=command.HELP,
            description=command.HELP,
            epilog="example:\n  " + command.EXAMPLE,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument(
            "--format",
            choices=command.FORMATS,
            default="text",
            help="output format (default text)",
        )
        sub.add_argument(
            "--color",
            choices=("auto", "always", "never"),
            default="auto",
            help="colour diagnostics",
        )
        command.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # The reader went away (`soagen show ... | head -1`): stop quietly, as other tools do.
        _silence_stdout()
        return EXIT_PROBLEMS


_TOP_LEVEL_OPTIONS = ("-h", "--help", "--version")


def _main(arguments: list[str]) -> int:
    # `soagen FILE` means `soagen generate FILE`, generate's options before the file included: the
    # top level has no option but --help and --version.
    if arguments and arguments[0] not in COMMANDS and arguments[0] not in _TOP_LEVEL_OPTIONS:
        arguments.insert(0, "generate")
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exit_:
        return EXIT_USAGE if exit_.code not in (0, None) else EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    output = Output(args.format, args.color)
    try:
        status = COMMANDS[args.command].run(args, output)
        output.flush()
    except BrokenPipeError:
        raise  # not a file the user named: see `main`
    except (UsageError, OSError) as error:
        if args.format == "json":
            print(json.dumps({"error": str(error)}))
        else:
            print(f"soagen: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not fail on the closed pipe."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a file (tests capture output in memory)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)
