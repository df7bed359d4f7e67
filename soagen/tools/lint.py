"""`soagen lint`: style and design rules over checked schemas, one declarative table entry per rule.

A schema the checker rejects is not linted: its errors are reported instead. Each rule is a code of
kind `lint` in `soagen.dsl.codes` (its stable ID, also the diagnostic code, its category, purpose and
explanation) and a check in `CHECKS` here, keyed by that ID. Categories nest like buf's: MINIMAL is
in BASIC, BASIC in STANDARD (the default).

Settings live in `[tool.soagen.lint]` of the nearest pyproject.toml (see `soagen.tools.config`):

    select = ["STANDARD"]                  # categories or rule IDs
    ignore = ["LAYOUT_UNUSED"]
    cache-line = 128                       # bytes; ALIGN_CACHE_LINE's threshold
    per-file-ignores = { "legacy/*.soa" = ["LAYOUT_PASCAL_CASE"] }
    per-file-select = { "public/*.soa" = ["MEMBER_DOC_COMMENT"] }

Nothing here imports torch or numpy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soagen.dsl.codes import CATEGORIES as CODE_CATEGORIES
from soagen.dsl.codes import LINT, Code, of_kind
from soagen.dsl.diagnostics import Diagnostic, Span, did_you_mean
from soagen.dsl.dtypes import INTEGER_DTYPES
from soagen.dsl.ir import DEFAULT_ALIGN, Binding, Member, MemberKind, SchemaFile
from soagen.dsl.loader import load
from soagen.dsl.names import is_python_keyword, to_pascal_case, to_snake_case
from soagen.tools.config import Config, ConfigError, find_config

# Each category holds the rules of the ones before it.
CATEGORIES = CODE_CATEGORIES[LINT]
DEFAULT_SELECT = ("STANDARD",)
SETTINGS = frozenset({"select", "ignore", "cache-line", "per-file-ignores", "per-file-select"})


@dataclass(frozen=True, slots=True)
class LintOptions:
    # CMSSW's default alignment: the cache line of the largest GPUs.
    cache_line: int = DEFAULT_ALIGN


@dataclass(frozen=True, slots=True)
class FileContext:
    """What a rule sees: one checked file, the layouts bound anywhere in the run, the options."""

    file: SchemaFile
    used_layouts: frozenset[str]
    options: LintOptions


@dataclass(frozen=True, slots=True)
class Rule:
    """A lint code of the registry (ID, category, purpose) with its check."""

    code: Code
    check: Callable[[FileContext, Rule], Iterator[Diagnostic]]

    @property
    def id(self) -> str:
        return self.code.id

    @property
    def category(self) -> str:
        return self.code.category

    @property
    def purpose(self) -> str:
        return self.code.purpose

    def finding(self, message: str, span: Span, hint: str | None = None) -> Diagnostic:
        return Diagnostic(self.id, message, span, hint)


# --- naming -------------------------------------------------------------------------------------

PASCAL_CASE = re.compile(r"[A-Z][A-Za-z0-9]*\Z")
SNAKE_CASE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*\Z")


def _rename_hint(suggestion: str) -> str:
    if is_python_keyword(suggestion):
        return f"rename it: `{suggestion}` would be a Python keyword, try `{suggestion}_value`"
    return f"rename it `{suggestion}`"


def _check_layout_names(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for layout in context.file.layouts:
        if not PASCAL_CASE.match(layout.name):
            yield rule.finding(
                f"layout `{layout.name}` is not PascalCase",
                layout.span,
                _rename_hint(to_pascal_case(layout.name)),
            )


def _check_model_names(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for model in context.file.models:
        if not PASCAL_CASE.match(model.name):
            yield rule.finding(
                f"model `{model.name}` is not PascalCase",
                model.span,
                _rename_hint(to_pascal_case(model.name)),
            )


def _check_member_names(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for layout in context.file.layouts:
        for member in layout.members:
            if not SNAKE_CASE.match(member.name):
                yield rule.finding(
                    f"{member.kind.value} `{layout.name}.{member.name}` is not snake_case",
                    member.span,
                    _rename_hint(to_snake_case(member.name)),
                )


def _check_binding_names(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for model in context.file.models:
        for binding in model.bindings:
            if not SNAKE_CASE.match(binding.name):
                yield rule.finding(
                    f"binding `{model.name}.{binding.name}` is not snake_case",
                    binding.span,
                    _rename_hint(to_snake_case(binding.name)),
                )


def _holds_integers(binding: Binding) -> bool:
    return binding.first_member.dtype_name in INTEGER_DTYPES


def _check_index_inputs(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for model in context.file.models:
        for binding in model.inputs:
            if binding.indexes or not _holds_integers(binding):
                continue
            # Suggest an input that holds no integers itself: what an index usually numbers.
            others = sorted(
                (other for other in model.inputs if other.name != binding.name),
                key=_holds_integers,
            )
            yield rule.finding(
                f"integer input `{model.name}.{binding.name}` does not say which input's elements "
                "it numbers: its values go unchecked",
                binding.span,
                f"write `indexes {others[0].name if others else 'NAME'}` (the input it indexes) after "
                "the block, or ignore INTEGER_INPUT_INDEXES if its values are not element numbers",
            )


# --- documentation ------------------------------------------------------------------------------


def _check_layout_docs(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for layout in context.file.layouts:
        if layout.doc is None:
            yield rule.finding(
                f"layout `{layout.name}` has no doc comment",
                layout.span,
                f"write a `///` line above `layout {layout.name}`: it becomes the class docstring",
            )


def _check_model_docs(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for model in context.file.models:
        if model.doc is None:
            yield rule.finding(
                f"model `{model.name}` has no doc comment",
                model.span,
                f"write a `///` line above `model {model.name}`: it becomes the class docstring",
            )


# --- usage --------------------------------------------------------------------------------------


def _check_unused_layouts(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    for layout in context.file.layouts:
        if layout.name not in context.used_layouts:
            yield rule.finding(
                f"layout `{layout.name}` is not bound by any model of the linted files or of "
                "the schemas beside them",
                layout.span,
                "bind it in a model, lint it together with the files that import it, "
                "or ignore LAYOUT_UNUSED for data-only layouts",
            )


# --- memory layout ------------------------------------------------------------------------------


def _check_alignment(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    cache_line = context.options.cache_line
    for layout in context.file.layouts:
        if layout.align < cache_line:
            span = layout.align_statements[0][1] if layout.align_statements else layout.span
            yield rule.finding(
                f"alignment {layout.align} of `{layout.name}` is below the {cache_line}-byte "
                "cache line: neighbouring columns share cache lines and vector loads split",
                span,
                f"write `align {cache_line}`, or set `cache-line` in [tool.soagen.lint]",
            )


def _type_text(member: Member) -> str:
    shape = f"[{', '.join(map(str, member.shape))}]" if member.shape else ""
    return member.dtype_name + shape


def _check_scalars_between_columns(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    """A run of scalars with columns of one dtype and shape on both sides keeps them apart."""
    for layout in context.file.layouts:
        members = layout.members
        index = 0
        while index < len(members):
            if members[index].kind is not MemberKind.SCALAR:
                index += 1
                continue
            end = index
            while end < len(members) and members[end].kind is MemberKind.SCALAR:
                end += 1
            if 0 < index and end < len(members):
                before, after = members[index - 1], members[end]
                if _type_text(before) == _type_text(after):
                    scalars = ", ".join(f"`{m.name}`" for m in members[index:end])
                    yield rule.finding(
                        f"scalar {scalars} of `{layout.name}` lies between the "
                        f"{_type_text(before)} columns `{before.name}` and `{after.name}`, "
                        "which could otherwise form one zero-copy block",
                        members[index].span,
                        "declare scalars before or after the columns",
                    )
            index = end


def _check_column_grouping(context: FileContext, rule: Rule) -> Iterator[Diagnostic]:
    """Columns of one type split by columns of another type can never be bound as one block."""
    for layout in context.file.layouts:
        columns = [m for m in layout.members if m.kind is MemberKind.COLUMN]
        groups: dict[str, list[Member]] = {}
        previous: Member | None = None
        for column in columns:
            key = _type_text(column)
            group = groups.setdefault(key, [])
            if group and previous is not None and _type_text(previous) != key:
                start = columns.index(group[-1]) + 1
                between = columns[start : columns.index(column)]
                names = ", ".join(f"`{m.name}`" for m in group)
                others = ", ".join(f"`{m.name}` ({_type_text(m)})" for m in between)
                yield rule.finding(
                    f"{key} column `{column.name}` of `{layout.name}` is separated from the "
                    f"{key} column{'s' if len(group) > 1 else ''} {names} by {others}",
                    column.span,
                    f"declare `{column.name}` right after `{group[-1].name}` so the {key} "
                    "columns can be bound as one zero-copy block",
                )
            group.append(column)
            previous = column


# --- the table ----------------------------------------------------------------------------------

# Rule ID -> check; what each rule is and why lives in `soagen.dsl.codes` (a test keeps the two
# tables equal). Rules run, and are listed, in the registry's order.
CHECKS: dict[str, Callable[[FileContext, Rule], Iterator[Diagnostic]]] = {
    "SCALAR_BETWEEN_COLUMNS": _check_scalars_between_columns,
    "COLUMNS_GROUPED_BY_TYPE": _check_column_grouping,
    "ALIGN_CACHE_LINE": _check_alignment,
    "INTEGER_INPUT_INDEXES": _check_index_inputs,
    "LAYOUT_PASCAL_CASE": _check_layout_names,
    "MODEL_PASCAL_CASE": _check_model_names,
    "MEMBER_SNAKE_CASE": _check_member_names,
    "BINDING_SNAKE_CASE": _check_binding_names,
    "LAYOUT_DOC_COMMENT": _check_layout_docs,
    "MODEL_DOC_COMMENT": _check_model_docs,
    "LAYOUT_UNUSED": _check_unused_layouts,
}
RULES: tuple[Rule, ...] = tuple(
    Rule(code, CHECKS[code.id]) for code in of_kind(LINT) if code.id in CHECKS
)
RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}


# --- selection ----------------------------------------------------------------------------------


def expand(names: Iterable[str], where: str) -> set[str]:
    """Rule IDs meant by a list of categories and rule IDs (case-insensitive)."""
    chosen: set[str] = set()
    for raw in names:
        if not isinstance(raw, str):
            raise ConfigError(f"{where}: expected rule IDs or categories, got {raw!r}")
        name = raw.strip().upper()
        if name in ("ALL", *CATEGORIES):
            depth = len(CATEGORIES) if name == "ALL" else CATEGORIES.index(name) + 1
            chosen |= {rule.id for rule in RULES if rule.category in CATEGORIES[:depth]}
        elif name in RULES_BY_ID:
            chosen.add(name)
        else:
            hint = did_you_mean(name, [*RULES_BY_ID, *CATEGORIES])
            raise ConfigError(
                f"{where}: unknown rule or category `{raw}`" + (f"; {hint}" if hint else "")
            )
    return chosen


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """`*` within a folder, `**` across folders, `?` one character; no `/` matches the file name."""
    out = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            out.append(".*")
            index += 2
        elif pattern[index] == "*":
            out.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            out.append("[^/]")
            index += 1
        else:
            out.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(out) + r"\Z")


def path_matches(pattern: str, path: Path, root: Path) -> bool:
    """Whether a per-file pattern of the config at `root` names the schema at `path`."""
    try:
        relative = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return False
    regex = _glob_regex(pattern.removeprefix("./"))
    if "/" not in pattern:
        return bool(regex.match(relative.rsplit("/", 1)[-1]))
    return bool(regex.match(relative))


@dataclass(frozen=True, slots=True)
class Selection:
    """What one config says, ready to apply to any file below it."""

    config: Config
    select: frozenset[str]
    ignore: frozenset[str]
    per_file_ignores: tuple[tuple[str, frozenset[str]], ...]
    per_file_select: tuple[tuple[str, frozenset[str]], ...]
    options: LintOptions

    def rules_for(self, path: Path) -> list[Rule]:
        chosen = set(self.select)
        for pattern, ids in self.per_file_select:
            if path_matches(pattern, path, self.config.root):
                chosen |= ids
        chosen -= self.ignore
        for pattern, ids in self.per_file_ignores:
            if path_matches(pattern, path, self.config.root):
                chosen -= ids
        return [rule for rule in RULES if rule.id in chosen]


def _per_file(
    table: dict[str, Any], key: str, where: str
) -> tuple[tuple[str, frozenset[str]], ...]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: `{key}` must be a table of glob = [rules]")
    entries = []
    for pattern, names in value.items():
        if not isinstance(names, list):
            raise ConfigError(f"{where}: `{key}.{pattern}` must be a list of rules")
        entries.append((pattern, frozenset(expand(names, f"{where}: `{key}.{pattern}`"))))
    return tuple(entries)


def selection_from(
    config: Config, select: Sequence[str] | None = None, ignore: Sequence[str] = ()
) -> Selection:
    """The rules a config selects; `select` (command line) replaces its list, `ignore` adds to it."""
    where = str(config.path) if config.path is not None else "command line"
    table = config.section("lint")
    unknown = sorted(set(table) - SETTINGS)
    if unknown:
        hint = did_you_mean(unknown[0], SETTINGS)
        raise ConfigError(
            f"{where}: unknown setting `tool.soagen.lint.{unknown[0]}`"
            + (f"; {hint}" if hint else "")
        )
    configured_select = table.get("select", list(DEFAULT_SELECT))
    configured_ignore = table.get("ignore", [])
    for key, value in (("select", configured_select), ("ignore", configured_ignore)):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: `tool.soagen.lint.{key}` must be a list")
    cache_line = table.get("cache-line", DEFAULT_ALIGN)
    if (
        not isinstance(cache_line, int)
        or isinstance(cache_line, bool)
        or cache_line <= 0
        or cache_line & (cache_line - 1)
    ):
        raise ConfigError(f"{where}: `tool.soagen.lint.cache-line` must be a power of two")
    return Selection(
        config,
        frozenset(
            expand(select, "--select") if select is not None else expand(configured_select, where)
        ),
        frozenset(expand(configured_ignore, where) | expand(ignore, "--ignore")),
        _per_file(table, "per-file-ignores", where),
        _per_file(table, "per-file-select", where),
        LintOptions(cache_line),
    )


# --- running ------------------------------------------------------------------------------------


@dataclass
class LintReport:
    """Schema errors of files that do not load, then the findings of the rest, sorted by place."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    schema_errors: int = 0
    findings: int = 0
    files: int = 0


def _layouts_bound_beside(paths: Sequence[Path]) -> set[str]:
    """Layouts bound by the models of the other .soa files in the folders of `paths`: the files
    that most likely import them. Files that do not load are skipped: they are not being linted."""
    given = {path.resolve() for path in paths}
    folders = {path.parent for path in given}
    siblings = sorted({s for folder in folders for s in folder.glob("*.soa")} - given)
    used: set[str] = set()
    for sibling in siblings:
        schema = load(sibling).schema if sibling.is_file() else None
        if schema is not None:
            for model in schema.root.models:
                used.update(binding.layout_name for binding in model.bindings)
    return used


def lint(
    paths: Sequence[Path],
    select: Sequence[str] | None = None,
    ignore: Sequence[str] = (),
    config: Config | None = None,
) -> LintReport:
    """Lint schema files. Each is linted with `config`, or with the config found above it."""
    # Wrong command-line rules are a usage error whatever the files hold: say so before reading them.
    expand(select or (), "--select")
    expand(ignore, "--ignore")
    report = LintReport()
    used = _layouts_bound_beside(paths)
    selections: dict[Path | None, Selection] = {}
    checked: list[tuple[Path, SchemaFile]] = []
    seen_files: set[str] = set()
    for path in paths:
        result = load(path)
        report.sources.update(result.sources)
        if result.schema is None:
            fresh = [d for d in result.diagnostics if d not in report.diagnostics]
            report.diagnostics += fresh
            report.schema_errors += len(fresh)
            continue
        for model in result.schema.models.values():
            used.update(binding.layout_name for binding in model.bindings)
        if result.schema.root.path not in seen_files:
            seen_files.add(result.schema.root.path)
            checked.append((path, result.schema.root))
    findings: list[Diagnostic] = []
    for path, schema_file in checked:
        file_config = config if config is not None else find_config(path)
        selection = selections.get(file_config.path)
        if selection is None:
            selection = selection_from(file_config, select, ignore)
            selections[file_config.path] = selection
        context = FileContext(schema_file, frozenset(used), selection.options)
        for rule in selection.rules_for(path):
            findings += rule.check(context, rule)
    report.files = len({path.resolve() for path in paths})
    report.findings = len(findings)
    report.diagnostics = sorted(report.diagnostics + findings, key=Diagnostic.sort_key)
    return report
