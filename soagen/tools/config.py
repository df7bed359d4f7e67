"""`[tool.soagen]` in pyproject.toml: found by walking up from a schema (or the working directory).

Only the nearest pyproject.toml that has a `[tool.soagen]` table counts, as with ruff: a project's
settings never leak into a nested project that has its own. Errors in the file are `ConfigError`s
naming the file, so the CLI can report them as usage errors.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with the `tomli` backport (a 3.10-only dependency)
    import tomli as tomllib

PYPROJECT = "pyproject.toml"


class ConfigError(Exception):
    """A `[tool.soagen]` table that cannot be used; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Config:
    """The `[tool.soagen]` table of one pyproject.toml (empty when none was found)."""

    path: Path | None  # the pyproject.toml it came from
    table: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """Folder that relative paths in the table (per-file patterns) are relative to."""
        return self.path.parent if self.path is not None else Path.cwd()

    def section(self, name: str) -> dict[str, Any]:
        value = self.table.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{self.path}: `tool.soagen.{name}` must be a table")
        return value


@functools.cache
def _read(path: Path) -> Config | None:
    """The file's `[tool.soagen]` table, None when it has none. Cached: lint asks once per folder."""
    try:
        with path.open("rb") as stream:
            document = tomllib.load(stream)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from error
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from error
    tool = document.get("tool", {})
    table = tool.get("soagen") if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: `tool.soagen` must be a table")
    return Config(path, table)


@functools.cache
def _find_from(folder: Path) -> Config:
    for candidate in (folder, *folder.parents):
        path = candidate / PYPROJECT
        if path.is_file():
            found = _read(path)
            if found is not None:
                return found
    return Config(None)


def find_config(start: Path | None = None) -> Config:
    """The settings for a schema at `start` (a file or folder), or for the working directory."""
    folder = (start or Path.cwd()).resolve()
    if not folder.is_dir():
        folder = folder.parent
    return _find_from(folder)


def load_config(path: Path) -> Config:
    """An explicitly named pyproject.toml (`--config`); without a `[tool.soagen]` table it is empty."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    return _read(path.resolve()) or Config(path.resolve())
