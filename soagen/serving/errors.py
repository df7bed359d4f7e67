"""Errors of remote model calls and of `soagen serve`. Importing this module imports nothing heavy.

Each derives from `SoaRuntimeError`, so `except SoaRuntimeError` catches remote failures as it catches
local ones, and from the built-in exception a caller would expect. Messages name the server's URL.
"""

from __future__ import annotations

from soagen.build.errors import CommandError
from soagen.runtime.errors import OutputError, SoaRuntimeError


class RemoteError(SoaRuntimeError):
    """A remote model call failed; nothing was written into the output collections."""


class RemoteUnavailableError(RemoteError, ConnectionError):
    """The server could not be reached, or did not answer in time, on every attempt."""


class RemoteInferenceError(RemoteError, RuntimeError):
    """The server answered with an error (the model raised, or refused the request): not retried."""


class RemoteResponseError(RemoteError, OutputError):
    """The server's response does not fit the output blocks (a missing output, another dtype or
    shape); as for a local model's outputs, nothing was written."""


class RemoteConfigurationError(RemoteError, ValueError):
    """An argument of `remote(...)` cannot work with this server (shared memory refused, say)."""


class ServeError(CommandError, SoaRuntimeError, RuntimeError):
    """`soagen serve` cannot start or serve the model; `usage` marks a wrong argument. A
    `CommandError` too, as the other commands' errors are."""
