"""What generated modules import: metadata classes, the collection and model base classes, errors.

Importing this package imports neither torch nor numpy; they load when a collection first touches memory.
"""

from soagen.runtime.collection import Collection
from soagen.runtime.errors import (
    BufferTooSmallError,
    ColumnError,
    DeviceError,
    ElementCountError,
    GeometryError,
    InvalidBufferError,
    MisalignedBufferError,
    NonContiguousBufferError,
    ReadOnlyBufferError,
    ReadOnlyCollectionError,
    SliceRangeError,
    SoaRuntimeError,
    UnknownNameError,
    UnsupportedBufferError,
)
from soagen.runtime.model import ModelBinding
from soagen.runtime.spec import BindingSpec, BlockSpec, MemberSpec, StridedView
from soagen.runtime.version import check_generated_version

__all__ = [
    "BindingSpec",
    "BlockSpec",
    "BufferTooSmallError",
    "Collection",
    "ColumnError",
    "DeviceError",
    "ElementCountError",
    "GeometryError",
    "InvalidBufferError",
    "MemberSpec",
    "MisalignedBufferError",
    "ModelBinding",
    "NonContiguousBufferError",
    "ReadOnlyBufferError",
    "ReadOnlyCollectionError",
    "SliceRangeError",
    "SoaRuntimeError",
    "StridedView",
    "UnknownNameError",
    "UnsupportedBufferError",
    "check_generated_version",
]
