"""`soagen breaking`: changes since a git ref that break generated code or shared buffers."""

from __future__ import annotations

import argparse
import json
import sys

from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    add_schemas_argument,
    counted,
    print_diagnostics,
)
from soagen.dsl.diagnostics import Diagnostic, to_json_object

HELP = "report changes since a git ref that break generated code or shared buffers"
EXAMPLE = "soagen breaking --against origin/main schemas/\n  soagen breaking --against HEAD~1 --format json"
FORMATS: tuple[str, ...] = ("text", "json", "github")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schemas_argument(parser, default=".", extra=": every .soa file git knows of")
    parser.add_argument(
        "--against", required=True, metavar="REF", help="git ref to compare with (HEAD, a branch)"
    )


def run(args: argparse.Namespace, output: Output) -> int:
    from soagen.tools.breaking import BreakingUsageError, compare

    try:
        report = compare(args.schemas, args.against)
    except BreakingUsageError as error:
        raise UsageError(str(error)) from error
    if report.errors:
        output.sources.update(report.sources)
        output.diagnostics += report.errors
        if output.format == "text":
            print("cannot compare: the schemas have errors", file=sys.stderr)
        return EXIT_PROBLEMS
    diagnostics = [change.diagnostic for change in report.changes]
    if output.format == "json":
        changes = [
            {"level": change.level, **to_json_object(change.diagnostic)}
            for change in report.changes
        ]
        print(json.dumps({"against": args.against, "changes": changes}, indent=2))
    elif output.format == "github":
        print_diagnostics(diagnostics, report.sources, output)
    else:
        labelled = [
            Diagnostic(d.code, f"{change.level}: {d.message}", d.span, d.hint, "breaking")
            for change, d in zip(report.changes, diagnostics, strict=True)
        ]
        print_diagnostics(labelled, report.sources, output)
        levels = sorted({change.level for change in report.changes})
        if report.changes:
            print(
                f"{counted(len(report.changes), 'breaking change')} against {args.against} "
                f"({', '.join(levels)})"
            )
        else:
            print(f"no breaking changes against {args.against}")
    return EXIT_PROBLEMS if report.changes else EXIT_OK
