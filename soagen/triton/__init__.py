"""Triton Inference Server model repositories for a schema's models (`soagen triton`).

`soagen.triton.config` models `config.pbtxt` without torch: built from the checked schema, validated
against Triton's rules and rendered as text protobuf. `soagen.triton.repository` writes a model's
folder (the config, the model file in its version folder and, for Triton's Python backend, a
`model.py` that runs soagen's runtime); it imports torch when it builds a model file.
`soagen.triton.python_model` is what that `model.py` runs inside Triton.
"""

from soagen.triton.config import ConfigError, TritonError

__all__ = ["ConfigError", "TritonError"]
