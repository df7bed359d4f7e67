"""`soagen explain`: what a diagnostic code, a lint rule or a breaking-change rule means."""

from __future__ import annotations

import argparse
import json

from soagen.cli.common import EXIT_OK, Output, UsageError, explain_rule
from soagen.dsl.diagnostics import CODES, EXPLANATIONS

HELP = "say what a diagnostic code means"
EXAMPLE = "soagen explain SOA303\n  soagen explain LAYOUT_PASCAL_CASE"
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("code", metavar="CODE", help="e.g. SOA303 or a lint rule ID")


def run(args: argparse.Namespace, output: Output) -> int:
    code = args.code.upper()
    if code not in CODES:
        text = explain_rule(code)
        if text is None:
            raise UsageError(
                f"unknown code `{args.code}`; codes are {', '.join(CODES)}, and the rule IDs "
                "of `soagen lint --list-rules`"
            )
        print(json.dumps({"code": code, "summary": text}) if output.format == "json" else text)
        return EXIT_OK
    explanation = EXPLANATIONS[code]
    if output.format == "json":
        print(json.dumps({"code": code, "summary": CODES[code], "explanation": explanation}))
    else:
        print(f"{code}: {CODES[code]}\n\n{explanation}")
    return EXIT_OK
