"""`soagen lint`: check schemas against style and design rules; the engine loads when it runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    add_schemas_argument,
    counted,
    path_argument,
    print_diagnostics,
    schema_paths,
)
from soagen.dsl.codes import LINT, of_kind
from soagen.dsl.diagnostics import to_json_object

HELP = "check schemas against style and design rules (pyproject [tool.soagen.lint])"
EXAMPLE = (
    "soagen lint schemas/                # every rule of STANDARD\n"
    "  soagen lint schemas/ --select BASIC --ignore ALIGN_CACHE_LINE --format github\n"
    "  soagen lint --list-rules"
)
FORMATS: tuple[str, ...] = ("text", "json", "github")


def _rule_list(text: str) -> list[str]:
    return [item for item in (part.strip() for part in text.split(",")) if item]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schemas_argument(parser)
    parser.add_argument(
        "--select",
        type=_rule_list,
        metavar="RULES",
        help="comma-separated rule IDs or categories (MINIMAL, BASIC, STANDARD); replaces the "
        "configured list",
    )
    parser.add_argument(
        "--ignore",
        type=_rule_list,
        default=[],
        metavar="RULES",
        help="comma-separated rule IDs or categories to leave out",
    )
    parser.add_argument(
        "--config",
        type=path_argument,
        metavar="PYPROJECT",
        help="a pyproject.toml to use instead of the nearest one above each schema",
    )
    parser.add_argument(
        "--list-rules", action="store_true", help="print every rule with its category and exit"
    )


def run(args: argparse.Namespace, output: Output) -> int:
    from soagen.tools.config import ConfigError, load_config
    from soagen.tools.lint import lint

    if args.list_rules:
        rules = of_kind(LINT)
        if output.format == "json":
            listed = [{"id": r.id, "category": r.category, "purpose": r.purpose} for r in rules]
            print(json.dumps({"rules": listed}, indent=2))
        else:
            width = max(len(rule.id) for rule in rules)
            for rule in rules:
                print(f"{rule.id.ljust(width)}  {rule.category.ljust(8)}  {rule.purpose}")
        return EXIT_OK
    try:
        config = load_config(Path(args.config)) if args.config else None
        report = lint(schema_paths(args.schemas), args.select, args.ignore, config)
    except ConfigError as error:
        raise UsageError(str(error)) from error
    if output.format == "json":
        print(
            json.dumps(
                {
                    "diagnostics": [to_json_object(d) for d in report.diagnostics],
                    "files": report.files,
                    "findings": report.findings,
                    "schema_errors": report.schema_errors,
                },
                indent=2,
            )
        )
    else:
        print_diagnostics(report.diagnostics, report.sources, output)
        if output.format == "text":
            if report.diagnostics:
                parts = [counted(report.findings, "finding")]
                if report.schema_errors:
                    parts.append(counted(report.schema_errors, "schema error"))
                print(f"{' and '.join(parts)} in {counted(report.files, 'file')}")
            else:
                print(f"{counted(report.files, 'file')} checked: no findings")
    return EXIT_PROBLEMS if report.diagnostics else EXIT_OK
