"""Base class of generated layout classes (filled in by the runtime issue)."""

from __future__ import annotations

import typing

from soagen.runtime.spec import BlockSpec, MemberSpec, StridedView

if typing.TYPE_CHECKING:
    import torch


class Collection:
    NAME: typing.ClassVar[str]
    SCHEMA: typing.ClassVar[str]
    ALIGNMENT: typing.ClassVar[int]
    MEMBERS: typing.ClassVar[tuple[MemberSpec, ...]]
    BLOCKS: typing.ClassVar[dict[str, BlockSpec]]

    @staticmethod
    def offsets(n: int) -> dict[str, int]:
        raise NotImplementedError

    @staticmethod
    def byte_size(n: int) -> int:
        raise NotImplementedError

    @staticmethod
    def member_views(n: int) -> dict[str, StridedView]:
        raise NotImplementedError

    def _member(self, name: str) -> torch.Tensor:
        raise NotImplementedError
