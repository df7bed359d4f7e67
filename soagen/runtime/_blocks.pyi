"""A model's result written into its output block (`soagen/runtime/_blocks.c`)."""

from typing import Any

def set_torch(tensor_type: type[Any], increment_version: Any, /) -> None: ...

class BlockWriter:
    def __init__(
        self,
        target: Any,
        dims: int,
        rows: int,
        columns: int,
        itemsize: int,
        row_stride: int,
        column_stride: int,
        is_complex: bool,
    ) -> None: ...
    def __call__(self, source: Any, /) -> object: ...
