"""What generated modules import: metadata classes, the collection and model base classes, errors.

Importing this package imports neither torch nor numpy; they load when a collection first touches memory.
It imports `soagen.dsl`'s pure layout math and dtypes, and no other part (`ModelBinding.remote`
imports `soagen.serving` when it is called).
"""

from soagen.runtime.aligned import aligned_numpy, aligned_tensor
from soagen.runtime.collection import Collection
from soagen.runtime.cpu import ensure_cpu_settings, set_cpu_threads, set_malloc_tuning
from soagen.runtime.errors import (
    BindingError,
    BufferTooSmallError,
    CollectionFileError,
    ColumnError,
    CompiledModelMismatchError,
    CorruptFileError,
    DeviceError,
    ElementCountError,
    GeometryError,
    IncompleteEventWarning,
    InconsistentHeaderError,
    IndexRangeError,
    InputModifiedError,
    InvalidBufferError,
    MisalignedBufferError,
    MissingPackageError,
    ModelLoadError,
    NewerFormatError,
    NonContiguousBufferError,
    NotACollectionFileError,
    OutputError,
    ReadOnlyBufferError,
    ReadOnlyCollectionError,
    SliceRangeError,
    SoaRuntimeError,
    TruncatedFileError,
    UnknownNameError,
    UnsupportedBufferError,
    WrongLayoutFileError,
)
from soagen.runtime.event_files import (
    EventBatch,
    EventDataset,
    EventFile,
    EventWriter,
    IncompleteTail,
    collate_events,
    concatenate_events,
)
from soagen.runtime.model import ModelBinding
from soagen.runtime.spec import BindingSpec, BlockSpec, MemberSpec, StridedView
from soagen.runtime.version import check_generated_version

__all__ = [
    "BindingError",
    "BindingSpec",
    "BlockSpec",
    "BufferTooSmallError",
    "Collection",
    "CollectionFileError",
    "ColumnError",
    "CompiledModelMismatchError",
    "CorruptFileError",
    "DeviceError",
    "ElementCountError",
    "EventBatch",
    "EventDataset",
    "EventFile",
    "EventWriter",
    "GeometryError",
    "IncompleteEventWarning",
    "IncompleteTail",
    "InconsistentHeaderError",
    "IndexRangeError",
    "InputModifiedError",
    "InvalidBufferError",
    "MemberSpec",
    "MisalignedBufferError",
    "MissingPackageError",
    "ModelBinding",
    "ModelLoadError",
    "NewerFormatError",
    "NonContiguousBufferError",
    "NotACollectionFileError",
    "OutputError",
    "ReadOnlyBufferError",
    "ReadOnlyCollectionError",
    "SliceRangeError",
    "SoaRuntimeError",
    "StridedView",
    "TruncatedFileError",
    "UnknownNameError",
    "UnsupportedBufferError",
    "WrongLayoutFileError",
    "aligned_numpy",
    "aligned_tensor",
    "check_generated_version",
    "collate_events",
    "concatenate_events",
    "ensure_cpu_settings",
    "set_cpu_threads",
    "set_malloc_tuning",
]
