"""Serving generated models through NVIDIA Triton Inference Server: everything Triton.

- `soagen.serving.server`: `soagen serve` / `serve(...)`, a Triton server (PyTriton) running a
  generated binding on requests from many clients, with dynamic batching of whole events.
- `soagen.serving.client`: what `Model.remote(url)` returns, a binding whose calls run on the server
  (or on several: `soagen.serving.balancing` picks the server of each request and probes those out
  of rotation).
- `soagen.serving.shared_memory`: the client's shared-memory regions (system and CUDA), their pool
  and the copies into them.
- `soagen.serving.wire`: how blocks travel (names, datatypes, storage order), shared by both.
- `soagen.serving.events`: one event's tensors checked and loaded into fresh collections, shared
  by the server and the `model.py` of `soagen triton` repositories.
- `soagen.serving.model_config`: `config.pbtxt` modelled without torch, validated against Triton's
  rules and rendered as text protobuf.
- `soagen.serving.repository`: a model's folder in a Triton model repository (`soagen triton`);
  `soagen.serving.python_model` is what its `model.py` runs inside Triton's Python backend.

Imports `soagen.build`, `soagen.runtime` and `soagen.dsl`.

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
