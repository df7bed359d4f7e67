"""The error a command raises when it cannot go on. Importing this module imports nothing.

`soagen compile`, `soagen triton` and `soagen serve` each have their own subclass (`CompileError`,
`TritonError`, `ServeError`); the model-building helpers they share (`soagen.build.model`) raise
`CommandError` itself. Each command catches the base and reports what any of them raised.
"""

from __future__ import annotations


class CommandError(Exception):
    """A command cannot go on; `usage` marks a wrong argument (exit 2) rather than a model or file
    that does not work (exit 1)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


__all__ = ["CommandError"]
