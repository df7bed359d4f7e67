"""The compiled parts of a planned call (`soagen/runtime/_blocks.c`)."""

from typing import Any

def set_torch(tensor_type: type[Any], increment_version: Any, takes_tuple: bool, /) -> None: ...
def set_index_dtypes(dtypes: dict[Any, int], /) -> None: ...
def index_extremes(tensor: Any, /) -> tuple[int, int] | None: ...

class BlockWriter:
    def __init__(self, target: Any, fallback: Any = None) -> None: ...
    def __call__(self, source: Any, /) -> object: ...

class ModelRun:
    def __init__(
        self,
        runner: Any,
        guard: Any,
        signature: Any,
        signatures: tuple[Any, ...],
        writers: tuple[Any, ...],
        finish: Any,
        watched: bool,
    ) -> None: ...
    def __call__(self, views: list[Any], /) -> list[Any]: ...
