"""Errors the collection runtime raises. Importing this module imports neither torch nor NumPy.

Every error derives from `SoaRuntimeError` and from the built-in exception a caller would expect
(`ValueError`, `TypeError`, `IndexError`, `KeyError`), so both `except SoaRuntimeError` and the usual
`except ValueError` catch them. Messages name the argument at fault and the numbers involved.
"""

from __future__ import annotations


class SoaRuntimeError(Exception):
    """Base class of every error raised by `soagen.runtime` collections."""


class InvalidBufferError(SoaRuntimeError, ValueError):
    """The memory given to `wrap` cannot hold the collection as it is."""


class BufferTooSmallError(InvalidBufferError):
    """The buffer holds fewer bytes than `byte_size(n)`."""


class MisalignedBufferError(InvalidBufferError):
    """The buffer does not start on a multiple of the layout's alignment."""


class NonContiguousBufferError(InvalidBufferError):
    """The buffer is a strided view whose bytes are not one contiguous range."""


class ReadOnlyBufferError(InvalidBufferError):
    """The buffer is read-only memory and `read_only=True` was not given."""


class UnsupportedBufferError(SoaRuntimeError, TypeError):
    """The object given as a buffer is none of the supported kinds of memory."""


class DeviceError(SoaRuntimeError, ValueError):
    """A device is wrong for the operation: a buffer on another device, pinning off the host, ..."""


class ElementCountError(SoaRuntimeError, ValueError):
    """The element count `n` is negative or not an integer."""


class SliceRangeError(SoaRuntimeError, IndexError):
    """A slice does not lie within the collection."""


class ColumnError(SoaRuntimeError, ValueError):
    """`from_columns` got a missing, unknown, mis-shaped or mis-typed member."""


class GeometryError(SoaRuntimeError, ValueError):
    """A `StridedView` given to `view` does not fit the collection's buffer."""


class ReadOnlyCollectionError(SoaRuntimeError, PermissionError):
    """A writable view was asked of a collection that wraps memory read-only."""


class CollectionFileError(SoaRuntimeError, ValueError):
    """A collection file cannot be loaded as the layout asked for; the message names the file."""


class NotACollectionFileError(CollectionFileError):
    """The file does not start with the collection file magic bytes."""


class WrongLayoutFileError(CollectionFileError):
    """The file holds another layout (its name or its LAYOUT_KEY differs)."""


class TruncatedFileError(CollectionFileError):
    """The file holds fewer bytes than its header (or a header) needs."""


class CorruptFileError(CollectionFileError):
    """A checksum in the file does not match the bytes it covers."""


class NewerFormatError(CollectionFileError):
    """The file was written in a newer collection file format version than this soagen reads."""


class InconsistentHeaderError(CollectionFileError):
    """The header disagrees with itself, with its layout or with the file's size."""


class IncompleteEventWarning(UserWarning):
    """An event file ends in an incomplete event (a write cut short): its complete events are read,
    the incomplete one is not."""


class UnknownNameError(SoaRuntimeError, KeyError):
    """A member or block name that the layout does not declare."""

    def __str__(self) -> str:
        # KeyError quotes its argument; this message is a sentence.
        return str(self.args[0]) if self.args else ""


__all__ = [
    "BufferTooSmallError",
    "CollectionFileError",
    "ColumnError",
    "CorruptFileError",
    "DeviceError",
    "ElementCountError",
    "GeometryError",
    "IncompleteEventWarning",
    "InconsistentHeaderError",
    "InvalidBufferError",
    "MisalignedBufferError",
    "NewerFormatError",
    "NonContiguousBufferError",
    "NotACollectionFileError",
    "ReadOnlyBufferError",
    "ReadOnlyCollectionError",
    "SliceRangeError",
    "SoaRuntimeError",
    "TruncatedFileError",
    "UnknownNameError",
    "UnsupportedBufferError",
    "WrongLayoutFileError",
]


class BindingError(SoaRuntimeError, TypeError):
    """The collections given to a model call do not match the schema's bindings."""


class OutputError(SoaRuntimeError, ValueError):
    """A model returned outputs that do not fit the output blocks: nothing was written."""


class InputModifiedError(SoaRuntimeError, RuntimeError):
    """A model wrote into an input block."""


class IndexRangeError(SoaRuntimeError, IndexError):
    """An index input holds values outside the collection it indexes: the model was not run."""


class CompiledModelMismatchError(SoaRuntimeError, RuntimeError):
    """A compiled model's results disagree with the eager model's on the same inputs: nothing was
    written."""


class GraphCaptureError(SoaRuntimeError, RuntimeError):
    """A model call could not be captured into a CUDA graph (`graphs=True`): the model waits for the
    device, or runs work a graph cannot hold. Nothing was written."""


class GraphMismatchError(SoaRuntimeError, RuntimeError):
    """A captured CUDA graph's first replay disagreed with the eager run of the same call: the
    graph was discarded and the outputs left as they were."""


class ModelLoadError(SoaRuntimeError, ValueError):
    """A model file or object cannot serve this binding: unknown kind, or built for another schema."""


class MissingPackageError(SoaRuntimeError, ImportError):
    """An optional package a conversion needs is not installed; the message names the extra."""
