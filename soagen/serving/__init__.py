"""Serving generated models through NVIDIA Triton Inference Server.

- `soagen.serving.server`: `soagen serve` / `serve(...)`, a Triton server (PyTriton) running a
  generated binding on requests from many clients, with dynamic batching of whole events.
- `soagen.serving.client`: what `Model.remote(url)` returns, a binding whose calls run on the server.
- `soagen.serving.wire`: how blocks travel (names, datatypes, storage order), shared by both.
- `soagen.serving.events`: one event's tensors checked and loaded into fresh collections, shared
  by the server and the `model.py` of `soagen triton` repositories.

Importing this package imports neither torch, NumPy nor Triton's packages: `soagen[serve]` brings
them (`nvidia-pytriton` for the server, `tritonclient[grpc]` for clients).
"""

from soagen.serving.errors import (
    RemoteConfigurationError,
    RemoteError,
    RemoteInferenceError,
    RemoteResponseError,
    RemoteUnavailableError,
    ServeError,
)

__all__ = [
    "RemoteConfigurationError",
    "RemoteError",
    "RemoteInferenceError",
    "RemoteResponseError",
    "RemoteUnavailableError",
    "ServeError",
]
