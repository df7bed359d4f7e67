"""The compiled parts of a planned call (`soagen/runtime/_compiled.c`)."""

from typing import Any

def set_torch(tensor_type: type[Any], increment_version: Any, takes_tuple: bool, /) -> None: ...
def set_function_mode_check(check: Any, /) -> None: ...
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

class PlannedCall:
    function: Any
    def __init__(self, function: Any) -> None: ...
    def __get__(self, instance: Any, owner: Any = None) -> Any: ...
    def __call__(self, binding: Any, collections: Any, stream: Any, batch_size: Any, /) -> None: ...

class IndexCheckedCall:
    def __init__(
        self, checks: tuple[tuple[Any, int], ...], call: Any, check: Any, most: int
    ) -> None: ...
    def __call__(self) -> object: ...

class GraphCall:
    def __init__(
        self,
        buffers: tuple[Any, ...],
        addresses: tuple[int, ...],
        stream_of: Any,
        device: Any,
        placements: tuple[Any, ...],
        graphs: dict[Any, Any],
        module: Any,
        call: Any,
    ) -> None: ...
    def __call__(self) -> None: ...
