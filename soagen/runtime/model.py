"""Base class of generated model binding classes (filled in by the model-execution issue)."""

from __future__ import annotations

import typing

from soagen.runtime.spec import BindingSpec


class ModelBinding:
    NAME: typing.ClassVar[str]
    SCHEMA: typing.ClassVar[str]
    INPUTS: typing.ClassVar[tuple[BindingSpec, ...]]
    OUTPUTS: typing.ClassVar[tuple[BindingSpec, ...]]
