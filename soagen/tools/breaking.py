"""`soagen breaking --against REF`: what changed since a git ref that breaks producers or consumers.

Two levels:
- source: code written against the generated classes stops working: a layout, member, model or
  binding removed or renamed, a declaration moved to another module, a model's signature changed
  (bindings added, reordered, turned around, bound to other members or other axes);
- memory: a buffer written by one side is misread by the other: any offset, pitch, dtype, shape,
  kind or alignment that differs for the same n.

Offsets and pitches are compared symbolically (the same closed form and alignment means the same
bytes for every n) and, where the forms differ, at sample sizes to quote a witness n. The schemas at
REF are read from git objects (imports resolved at REF too), never from a checkout.
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from soagen.dsl.codes import BREAKING, of_kind
from soagen.dsl.diagnostics import Diagnostic, Span
from soagen.dsl.ir import Binding, Layout, Member, Model, Schema
from soagen.dsl.layout import Linear, byte_size, member_offsets
from soagen.dsl.loader import load

SOURCE, MEMORY = "source", "memory"
# Small sizes catch padding effects; powers of two and their neighbours catch alignment edges.
SAMPLE_SIZES = (0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 100, 127, 128, 129, 1000, 1024, 4097)

# Rule ID -> level (source or memory). What each rule means lives in `soagen.dsl.codes` (kind
# `breaking`, the level its category); `_Comparer` reports each by its ID, and a test keeps the IDs
# it reports and the registry's equal.
LEVELS: dict[str, str] = {code.id: code.category for code in of_kind(BREAKING)}


class BreakingUsageError(Exception):
    """Not a git repository, an unknown ref, paths outside the repository."""


@dataclass(frozen=True, slots=True)
class Change:
    level: str
    diagnostic: Diagnostic


@dataclass
class BreakingReport:
    changes: list[Change] = field(default_factory=list)
    # Schema errors on either side: nothing is compared when there are any.
    errors: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Declared:
    """Every layout and model of one side, with the module its class is generated into."""

    layouts: dict[str, tuple[Layout, str]]
    models: dict[str, tuple[Model, str]]


def _git(top: Path, *args: str, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(["git", *args], cwd=top, input=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        message = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise BreakingUsageError(f"git {args[0]} failed: {message[-1] if message else '?'}")
    return result.stdout


def git_toplevel(start: Path) -> Path:
    try:
        output = _git(start, "rev-parse", "--show-toplevel")
    except (BreakingUsageError, OSError) as error:
        raise BreakingUsageError(f"`{start}` is not inside a git repository") from error
    return Path(output.decode().strip()).resolve()


def _resolve_ref(top: Path, ref: str) -> str:
    try:
        return _git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").decode().strip()
    except BreakingUsageError as error:
        raise BreakingUsageError(f"unknown git ref `{ref}`") from error


def _materialize(top: Path, commit: str, into: Path) -> list[str]:
    """Write every .soa file of the commit below `into`; return their repository paths."""
    listing = _git(top, "ls-tree", "-r", "-z", commit)
    blobs: list[tuple[str, str]] = []
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, path = entry.split(b"\t", 1)
        mode, kind, sha = meta.split()
        name = path.decode("utf-8", "surrogateescape")
        if kind == b"blob" and mode != b"120000" and name.endswith(".soa"):
            blobs.append((sha.decode(), name))
    if not blobs:
        return []
    output = _git(top, "cat-file", "--batch", stdin="".join(f"{s}\n" for s, _ in blobs).encode())
    position = 0
    for _, name in blobs:
        header_end = output.index(b"\n", position)
        size = int(output[position:header_end].split()[2])
        content = output[header_end + 1 : header_end + 1 + size]
        position = header_end + 1 + size + 1
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return [name for _, name in blobs]


def _declared(schemas: Sequence[Schema]) -> _Declared:
    layouts: dict[str, tuple[Layout, str]] = {}
    models: dict[str, tuple[Model, str]] = {}
    for schema in schemas:
        for schema_file in schema.files:
            for layout in schema_file.layouts:
                layouts.setdefault(layout.name, (layout, schema_file.module_name))
            for model in schema_file.models:
                models.setdefault(model.name, (model, schema_file.module_name))
    return _Declared(layouts, models)


def _differ(old: Linear, old_align: int, new: Linear, new_align: int) -> int | None:
    """The first sample n at which two byte counts differ; None when they are equal for every n."""
    if old == new and old_align == new_align:
        return None
    for n in SAMPLE_SIZES:
        if old.evaluate(n, old_align) != new.evaluate(n, new_align):
            return n
    return None


class _Comparer:
    def __init__(self, remap_old: Callable[[Span], Span]) -> None:
        self.remap_old = remap_old
        self.changes: list[Change] = []

    def report(self, rule: str, message: str, span: Span, hint: str | None = None) -> None:
        level = LEVELS[rule]
        self.changes.append(Change(level, Diagnostic(rule, message, span, hint)))

    def old(self, span: Span) -> Span:
        return self.remap_old(span)

    def layouts(self, old: _Declared, new: _Declared) -> None:
        for name, (old_layout, old_module) in old.layouts.items():
            found = new.layouts.get(name)
            if found is None:
                self.report(
                    "LAYOUT_REMOVED",
                    f"layout `{name}` was removed or renamed",
                    self.old(old_layout.span),
                    "code importing it and buffers described by it lose their class",
                )
                continue
            new_layout, new_module = found
            if new_module != old_module:
                self.report(
                    "LAYOUT_MOVED",
                    f"layout `{name}` moved from module `{old_module}` to `{new_module}`",
                    new_layout.span,
                    f"`from ...{old_module} import {name}` stops working",
                )
            self.layout(old_layout, new_layout)

    def layout(self, old: Layout, new: Layout) -> None:
        before = len(self.changes)
        align_span = new.align_statements[0][1] if new.align_statements else new.span
        if old.align != new.align:
            self.report(
                "LAYOUT_ALIGN_CHANGED",
                f"alignment of `{new.name}` changed from {old.align} to {new.align}: "
                "pitches and offsets move",
                align_span,
            )
        old_offsets, new_offsets = member_offsets(old), member_offsets(new)
        new_names = {m.name for m in new.members}
        for member in old.members:
            if member.name not in new_names:
                self.report(
                    "MEMBER_REMOVED",
                    f"{member.kind.noun} `{old.name}.{member.name}` was removed or renamed",
                    self.old(member.span),
                )
        for member in new.members:
            previous = old.member(member.name)
            if previous is None:
                self.report(
                    "MEMBER_ADDED",
                    f"{member.kind.noun} `{new.name}.{member.name}` was added: the buffer grows"
                    + (" and the members after it move" if member is not new.members[-1] else ""),
                    member.span,
                    "buffers made by the old schema are too small and misread",
                )
                continue
            self.member(old, previous, new, member, old_offsets, new_offsets)
        memory_reported = any(c.level == MEMORY for c in self.changes[before:])
        n = _differ(byte_size(old), old.align, byte_size(new), new.align)
        if n is not None and not memory_reported:
            self.report(
                "LAYOUT_SIZE_CHANGED",
                f"`{new.name}` takes {byte_size(new).evaluate(n, new.align)} bytes at n = {n}, "
                f"was {byte_size(old).evaluate(n, old.align)}",
                new.span,
            )

    def member(
        self,
        old_layout: Layout,
        old: Member,
        new_layout: Layout,
        new: Member,
        old_offsets: dict[str, Linear],
        new_offsets: dict[str, Linear],
    ) -> None:
        where = f"`{new_layout.name}.{new.name}`"
        if old.kind is not new.kind:
            self.report(
                "MEMBER_KIND_CHANGED",
                f"{where} changed from {old.kind.noun} to {new.kind.noun}",
                new.span,
            )
        if old.dtype_name != new.dtype_name:
            self.report(
                "MEMBER_DTYPE_CHANGED",
                f"dtype of {where} changed from {old.dtype_name} to {new.dtype_name}",
                new.dtype_span,
            )
        if old.shape != new.shape:
            self.report(
                "MEMBER_SHAPE_CHANGED",
                f"shape of {where} changed from {list(old.shape)} to {list(new.shape)}",
                new.dtype_span,
            )
        if old_layout.align != new_layout.align:
            return  # every offset moves: LAYOUT_ALIGN_CHANGED says so once
        n = _differ(
            old_offsets[old.name], old_layout.align, new_offsets[new.name], new_layout.align
        )
        if n is not None:
            before = old_offsets[old.name].evaluate(n, old_layout.align)
            after = new_offsets[new.name].evaluate(n, new_layout.align)
            self.report(
                "MEMBER_OFFSET_CHANGED",
                f"{where} moved from byte {before} to byte {after} (at n = {n})",
                new.span,
                "a member before it was added, removed, reordered or resized",
            )

    def models(self, old: _Declared, new: _Declared) -> None:
        for name, (old_model, old_module) in old.models.items():
            found = new.models.get(name)
            if found is None:
                self.report(
                    "MODEL_REMOVED",
                    f"model `{name}` was removed or renamed",
                    self.old(old_model.span),
                )
                continue
            new_model, new_module = found
            if new_module != old_module:
                self.report(
                    "MODEL_MOVED",
                    f"model `{name}` moved from module `{old_module}` to `{new_module}`",
                    new_model.span,
                    f"`from ...{old_module} import {name}` stops working",
                )
            self.model(old_model, new_model)

    def model(self, old: Model, new: Model) -> None:
        old_bindings = {b.name: b for b in old.bindings}
        new_bindings = {b.name: b for b in new.bindings}
        for binding in old.bindings:
            if binding.name not in new_bindings:
                self.report(
                    "BINDING_REMOVED",
                    f"{binding.direction.value} `{old.name}.{binding.name}` was removed or renamed",
                    self.old(binding.span),
                )
        for binding in new.bindings:
            if binding.name not in old_bindings:
                self.report(
                    "BINDING_ADDED",
                    f"model `{new.name}` has a new {binding.direction.value} `{binding.name}`",
                    binding.span,
                    "callers and the model's code must change together",
                )
        kept_old = [b.name for b in old.bindings if b.name in new_bindings]
        kept_new = [b.name for b in new.bindings if b.name in old_bindings]
        for old_name, new_name in zip(kept_old, kept_new, strict=True):
            if old_name != new_name:
                self.report(
                    "BINDING_ORDER_CHANGED",
                    f"bindings of `{new.name}` changed order: `{new_name}` now comes where "
                    f"`{old_name}` was",
                    new_bindings[new_name].span,
                    "positional arguments and INPUTS/OUTPUTS order change",
                )
                break
        for name in kept_new:
            self.binding(new.name, old_bindings[name], new_bindings[name])

    def binding(self, model: str, old: Binding, new: Binding) -> None:
        where = f"`{model}.{new.name}`"
        if old.direction is not new.direction:
            self.report(
                "BINDING_DIRECTION_CHANGED",
                f"{where} changed from {old.direction.value} to {new.direction.value}",
                new.span,
            )
        old_block = f"{old.layout_name}{{{', '.join(old.member_names)}}}"
        new_block = f"{new.layout_name}{{{', '.join(new.member_names)}}}"
        if old_block != new_block:
            self.report(
                "BINDING_BLOCK_CHANGED",
                f"{where} binds `{new_block}`, was `{old_block}`",
                new.layout_span,
            )
            return
        old_axes = old.axis_names
        new_axes = new.axis_names
        if old_axes != new_axes:
            self.report(
                "BINDING_AXES_CHANGED",
                f"{where} has axes [{', '.join(new_axes)}], was [{', '.join(old_axes)}]",
                new.axes_span or new.span,
                "the model receives a tensor of another shape",
            )
        if old.contiguous != new.contiguous:
            now = "a row-major copy" if new.contiguous else "the strided view"
            self.report(
                "BINDING_CONTIGUOUS_CHANGED",
                f"{where} is handed over as {now}, was "
                + ("the strided view" if new.contiguous else "a row-major copy"),
                new.contiguous_span or new.span,
                "packages from `soagen compile` must be compiled again",
            )
        if old.same_n_as != new.same_n_as:
            self.report(
                "BINDING_SAME_N_CHANGED",
                f"{where} shares {_shared_n(new)}, was {_shared_n(old)}",
                new.same_n_as_span or new.span,
                "packages from `soagen compile` must be compiled again, and calls are checked "
                "against other sizes",
            )
        if old.whole != new.whole:
            now, was = ("passed whole", "sliced") if new.whole else ("sliced", "passed whole")
            self.report(
                "BINDING_WHOLE_CHANGED",
                f"{where} is {now} by `batch_size` calls, was {was}",
                new.whole_span or new.span,
                "callers using `batch_size` get slices of other sizes",
            )


def _shared_n(binding: Binding) -> str:
    return "no other input's n" if binding.same_n_as is None else f"the n of `{binding.same_n_as}`"


def _working_tree_schemas(top: Path) -> list[str]:
    """Tracked and untracked (not ignored) .soa files as they are on disk, repository-relative."""
    listing = _git(top, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    names = {entry.decode("utf-8", "surrogateescape") for entry in listing.split(b"\0")}
    return sorted(n for n in names if n.endswith(".soa") and (top / n).is_file())


def _under(prefix: str, files: Sequence[str]) -> list[str]:
    """The files a command-line path names: itself, or everything below it for a folder."""
    if prefix in ("", "."):
        return list(files)
    return [f for f in files if f == prefix or f.startswith(prefix + "/")]


def _relative(path: Path, top: Path) -> str:
    try:
        return path.resolve().relative_to(top).as_posix()
    except ValueError as error:
        raise BreakingUsageError(f"`{path}` is outside the git repository {top}") from error


def compare(arguments: Sequence[str], ref: str, cwd: Path | None = None) -> BreakingReport:
    """Compare the schemas under `arguments` (files or folders) at `ref` with the working tree."""
    start = Path(cwd or Path.cwd())
    top = git_toplevel(start)
    commit = _resolve_ref(top, ref)
    report = BreakingReport()
    with tempfile.TemporaryDirectory(prefix="soagen-breaking-") as temporary:
        old_root = Path(temporary).resolve()
        old_files = _materialize(top, commit, old_root)
        new_files = _working_tree_schemas(top)
        old_roots: list[Path] = []
        new_roots: list[Path] = []
        for argument in arguments:
            prefix = _relative(start / argument, top)
            old_matching = _under(prefix, old_files)
            new_matching = _under(prefix, new_files)
            if not old_matching and not new_matching:
                raise BreakingUsageError(
                    f"no .soa files under `{argument}`, neither in the working tree nor at {ref}"
                )
            old_roots += [old_root / f for f in old_matching]
            new_roots += [top / f for f in new_matching]

        def remap(span: Span) -> Span:
            return dataclasses.replace(span, path=_old_name(span.path, old_root, ref))

        old_schemas = list(_load_all(old_roots, report, remap_path=remap))
        new_schemas = list(_load_all(new_roots, report, remap_path=None))
        if report.errors:
            return report
        comparer = _Comparer(remap)
        old_declared, new_declared = _declared(old_schemas), _declared(new_schemas)
        comparer.layouts(old_declared, new_declared)
        comparer.models(old_declared, new_declared)
        report.changes = sorted(
            comparer.changes, key=lambda c: (c.diagnostic.sort_key(), c.diagnostic.message)
        )
    return report


def _old_name(path: str, old_root: Path, ref: str) -> str:
    """`REF:repo/path.soa` for a file read from git, so it never passes for the working tree's."""
    try:
        return f"{ref}:{Path(path).resolve().relative_to(old_root).as_posix()}"
    except (ValueError, OSError):
        return path


def _load_all(
    roots: Sequence[Path],
    report: BreakingReport,
    remap_path: Callable[[Span], Span] | None,
) -> Iterator[Schema]:
    for root in roots:
        result = load(root)
        for shown, text in result.sources.items():
            key = shown if remap_path is None else remap_path(Span(shown, 1, 1, 1, 1)).path
            report.sources[key] = text
        if result.schema is None:
            for diagnostic in result.diagnostics:
                if remap_path is not None:
                    diagnostic = dataclasses.replace(diagnostic, span=remap_path(diagnostic.span))
                if diagnostic not in report.errors:
                    report.errors.append(diagnostic)
            continue
        yield result.schema
