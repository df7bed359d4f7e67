"""`soagen fmt`: print, check or rewrite schemas in the one canonical style."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    add_schemas_argument,
    counted,
    schema_paths,
    unified_diff,
)
from soagen.dsl.diagnostics import Diagnostic, Span, to_json_object
from soagen.dsl.loader import read_schema

HELP = "format schemas in the one canonical style, keeping every comment"
EXAMPLE = (
    "soagen fmt -w schemas/              # rewrite in place\n"
    "  soagen fmt --check --diff schemas/  # exit 1, with a diff, if not formatted\n"
    "  soagen fmt - < schemas/gnn.soa      # stdin to stdout"
)
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schemas_argument(parser, extra="; `-` reads stdin and writes stdout")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-w", "--write", action="store_true", help="rewrite files in place")
    mode.add_argument(
        "--check", action="store_true", help="exit 1 if any file is not formatted; change nothing"
    )
    parser.add_argument(
        "--diff",
        action="store_true",
        help="print a unified diff of what formatting would change; exit 1 if anything would",
    )


def run(args: argparse.Namespace, output: Output) -> int:
    from soagen.tools.fmt import FormatBug, format_source

    if "-" in args.schemas and args.schemas != ["-"]:
        raise UsageError("`-` (stdin) cannot be combined with paths")
    # (shown name, text or why it cannot be read, the file to rewrite: None for stdin)
    sources: list[tuple[str, str | tuple[str, Span], Path | None]] = []
    if args.schemas == ["-"]:
        sources.append(("<stdin>", sys.stdin.read(), None))
    else:
        for path in schema_paths(args.schemas):
            sources.append((path.as_posix(), read_schema(path, path.as_posix()), path))
    changed: list[str] = []
    failed = False
    results: list[dict[str, object]] = []
    printed: list[str] = []
    for shown, text, target in sources:
        if not isinstance(text, str):
            reason, where = text
            output.diagnostics.append(
                Diagnostic("SOA002", f"cannot read `{shown}`: {reason}", where)
            )
            results.append({"path": shown, "changed": False, "error": True})
            continue
        try:
            formatted, problems = format_source(text, shown)
        except FormatBug as bug:  # never expected; the file is left as it is
            print(f"soagen: internal error: {bug}", file=sys.stderr)
            results.append({"path": shown, "changed": False, "error": True})
            failed = True
            continue
        if formatted is None:
            output.sources[shown] = text
            output.diagnostics += problems
            results.append({"path": shown, "changed": False, "error": True})
            continue
        result: dict[str, object] = {"path": shown, "changed": formatted != text, "error": False}
        results.append(result)
        if formatted != text:
            changed.append(shown)
            if args.diff:
                result["diff"] = unified_diff(
                    text, formatted, f"{shown} (original)", f"{shown} (formatted)"
                )
            if args.write and target is not None:
                target.write_text(formatted, encoding="utf-8")
        if not (args.check or args.diff or (args.write and target is not None)):
            result["formatted"] = formatted
        printed.append(str(result.get("diff", result.get("formatted", ""))))
    status = EXIT_PROBLEMS if output.diagnostics or failed else EXIT_OK
    if changed and (args.check or args.diff):
        status = EXIT_PROBLEMS
    if output.format == "json":
        # One document: the diagnostics go in it instead of after it.
        diagnostics = [to_json_object(d) for d in output.diagnostics]
        print(json.dumps({"files": results, "diagnostics": diagnostics}, indent=2))
        output.diagnostics.clear()
        return status
    sys.stdout.write("".join(printed))
    if args.write:
        for shown in changed:
            print(f"formatted {shown}", file=sys.stderr)
    elif args.check or args.diff:
        for shown in changed:
            print(f"would reformat {shown}", file=sys.stderr)
        if not changed and not output.diagnostics and args.schemas != ["-"]:
            print(f"{counted(len(results), 'file')} already formatted", file=sys.stderr)
    return status
