"""The schema tooling commands of `soagen`: lint, fmt, breaking, completion.

Kept apart from `soagen.cli` so that file only registers them; each handler imports its engine when
it runs, so `soagen generate` never pays for them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from soagen.cli import (
    EXIT_OK,
    EXIT_PROBLEMS,
    UsageError,
    _Output,
    _schema_paths,
    add_schemas_argument,
    counted,
    path_argument,
    unified_diff,
)
from soagen.completion import GENERATORS, script
from soagen.diagnostics import Diagnostic, Span, render_github, render_text, to_json_object
from soagen.dsl.loader import read_schema

CommandFactory = Callable[..., argparse.ArgumentParser]


def _rule_list(text: str) -> list[str]:
    return [item for item in (part.strip() for part in text.split(",")) if item]


def add_commands(factory: CommandFactory) -> None:
    """Register the tooling subcommands through `soagen.cli`'s own `command` helper."""
    lint = factory(
        "lint",
        "check schemas against style and design rules (pyproject [tool.soagen.lint])",
        formats=("text", "json", "github"),
    )
    add_schemas_argument(lint)
    lint.add_argument(
        "--select",
        type=_rule_list,
        metavar="RULES",
        help="comma-separated rule IDs or categories (MINIMAL, BASIC, STANDARD); replaces the "
        "configured list",
    )
    lint.add_argument(
        "--ignore",
        type=_rule_list,
        default=[],
        metavar="RULES",
        help="comma-separated rule IDs or categories to leave out",
    )
    lint.add_argument(
        "--config",
        type=path_argument,
        metavar="PYPROJECT",
        help="a pyproject.toml to use instead of the nearest one above each schema",
    )
    lint.add_argument(
        "--list-rules", action="store_true", help="print every rule with its category and exit"
    )

    fmt = factory("fmt", "format schemas in the one canonical style, keeping every comment")
    add_schemas_argument(fmt, extra="; `-` reads stdin and writes stdout")
    mode = fmt.add_mutually_exclusive_group()
    mode.add_argument("-w", "--write", action="store_true", help="rewrite files in place")
    mode.add_argument(
        "--check", action="store_true", help="exit 1 if any file is not formatted; change nothing"
    )
    fmt.add_argument(
        "--diff",
        action="store_true",
        help="print a unified diff of what formatting would change; exit 1 if anything would",
    )

    breaking = factory(
        "breaking",
        "report changes since a git ref that break generated code or shared buffers",
        formats=("text", "json", "github"),
    )
    add_schemas_argument(breaking, default=".", extra=": every .soa file git knows of")
    breaking.add_argument(
        "--against", required=True, metavar="REF", help="git ref to compare with (HEAD, a branch)"
    )

    completion = factory("completion", "print a shell completion script", formats=("text",))
    completion.add_argument("shell", choices=tuple(GENERATORS), help="the shell")


def _print_diagnostics(
    diagnostics: list[Diagnostic], sources: dict[str, str], output: _Output
) -> None:
    if output.format == "github":
        if diagnostics:
            print(render_github(diagnostics, os.environ.get("GITHUB_WORKSPACE")))
    elif output.format == "text" and diagnostics:
        print(render_text(diagnostics, sources, output.color))


def cmd_lint(args: argparse.Namespace, output: _Output) -> int:
    from soagen.config import ConfigError, load_config
    from soagen.lint import RULES, lint

    if args.list_rules:
        if output.format == "json":
            rules = [{"id": r.id, "category": r.category, "purpose": r.purpose} for r in RULES]
            print(json.dumps({"rules": rules}, indent=2))
        else:
            width = max(len(rule.id) for rule in RULES)
            for rule in RULES:
                print(f"{rule.id.ljust(width)}  {rule.category.ljust(8)}  {rule.purpose}")
        return EXIT_OK
    try:
        config = load_config(Path(args.config)) if args.config else None
        report = lint(_schema_paths(args.schemas), args.select, args.ignore, config)
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
        _print_diagnostics(report.diagnostics, report.sources, output)
        if output.format == "text":
            if report.diagnostics:
                parts = [counted(report.findings, "finding")]
                if report.schema_errors:
                    parts.append(counted(report.schema_errors, "schema error"))
                print(f"{' and '.join(parts)} in {counted(report.files, 'file')}")
            else:
                print(f"{counted(report.files, 'file')} checked: no findings")
    return EXIT_PROBLEMS if report.diagnostics else EXIT_OK


def cmd_fmt(args: argparse.Namespace, output: _Output) -> int:
    from soagen.fmt import FormatBug, format_source

    if "-" in args.schemas and args.schemas != ["-"]:
        raise UsageError("`-` (stdin) cannot be combined with paths")
    # (shown name, text or why it cannot be read, the file to rewrite: None for stdin)
    sources: list[tuple[str, str | tuple[str, Span], Path | None]] = []
    if args.schemas == ["-"]:
        sources.append(("<stdin>", sys.stdin.read(), None))
    else:
        for path in _schema_paths(args.schemas):
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


def cmd_breaking(args: argparse.Namespace, output: _Output) -> int:
    from soagen.breaking import BreakingUsageError, compare

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
        _print_diagnostics(diagnostics, report.sources, output)
    else:
        labelled = [
            Diagnostic(d.code, f"{change.level}: {d.message}", d.span, d.hint, "breaking")
            for change, d in zip(report.changes, diagnostics, strict=True)
        ]
        _print_diagnostics(labelled, report.sources, output)
        levels = sorted({change.level for change in report.changes})
        if report.changes:
            print(
                f"{counted(len(report.changes), 'breaking change')} against {args.against} "
                f"({', '.join(levels)})"
            )
        else:
            print(f"no breaking changes against {args.against}")
    return EXIT_PROBLEMS if report.changes else EXIT_OK


def cmd_completion(args: argparse.Namespace, output: _Output) -> int:
    from soagen.cli import _parser

    sys.stdout.write(script(args.shell, _parser(), all_codes()))
    return EXIT_OK


def all_codes() -> tuple[str, ...]:
    """Every code `soagen explain` knows: diagnostics, lint rules, breaking-change kinds."""
    from soagen.breaking import BREAKING_RULES
    from soagen.diagnostics import CODES
    from soagen.lint import RULES_BY_ID

    return (*CODES, *RULES_BY_ID, *BREAKING_RULES)


def explain(code: str) -> str | None:
    """What a lint rule or a breaking-change kind means; None for other codes."""
    from soagen.breaking import BREAKING_RULES
    from soagen.lint import explain_rule

    text = explain_rule(code)
    if text is not None:
        return text
    if code in BREAKING_RULES:
        level, summary = BREAKING_RULES[code]
        return f"{code} (breaking, {level} level): {summary}"
    return None


HANDLERS: dict[str, Callable[[argparse.Namespace, _Output], int]] = {
    "lint": cmd_lint,
    "fmt": cmd_fmt,
    "breaking": cmd_breaking,
    "completion": cmd_completion,
}


def run(name: str, args: argparse.Namespace, output: _Output) -> int:
    return HANDLERS[name](args, output)
