"""Event files: many events in one file, each holding one collection of every layout declared.

`EventWriter(path, layouts)` appends events; `EventFile(path, layouts)` reads them by index or in
order, mapped without copies by default; `EventDataset` serves them to `torch.utils.data.DataLoader`,
with `collate_events` (a batch is the list of events) or `concatenate_events` (one collection per
layout, with offsets). The file is a header, then one record per event:

File header (little-endian), then zero padding to a multiple of 8, where the first record starts:

| offset | size | field           | meaning                                                        |
|-------:|-----:|-----------------|----------------------------------------------------------------|
|      0 |    8 | magic           | `b"\\x89SOAEVT\\n"` (a collection file's is `b"\\x89SOAGEN\\n"`)  |
|      8 |    4 | format_version  | `1`; a reader refuses a newer version                          |
|     12 |    4 | metadata_length | bytes of the JSON metadata that starts at offset 20            |
|     16 |    4 | header_crc32    | `zlib.crc32` of bytes 0-15 and the metadata                    |
|     20 |    - | metadata        | JSON: `layouts`, in order, as a collection file's metadata     |
|        |      |                 | describes its layout, plus each one's `alignment`              |

Record of event i, for k layouts, at a multiple of 8 (header: 32 + 24 k bytes):

| offset   | size | field         | meaning                                                          |
|---------:|-----:|---------------|------------------------------------------------------------------|
|        0 |    8 | marker        | `b"SOAEVENT"`                                                    |
|        8 |    8 | event_index   | i: the record's position in the file                             |
|       16 |    8 | record_size   | bytes from this record's start to the next one's                 |
| 24 + 24j |    8 | n             | layout j's element count                                         |
| 32 + 24j |    8 | byte_size     | `byte_size(n)` of layout j                                       |
| 40 + 24j |    8 | data_offset   | where layout j's buffer starts in the file: a multiple of its    |
|          |      |               | alignment, so that a mapping of the file places it aligned       |
| 24 + 24k |    4 | payload_crc32 | CRC32 of the k buffers' bytes one after the other (no padding)   |
| 28 + 24k |    4 | header_crc32  | CRC32 of the record header's bytes before it                     |

The buffers follow the record header in layout order, each after zero padding up to its alignment;
the record ends with zero padding to a multiple of 8.

Crash safety. A writer writes each record whole after the last complete one, flushes it to the
operating system, and fsyncs every `sync_every` records and on close. A file cut mid-record (a
crash, a full disk, a copy stopped short) reads back every complete event: the reader stops at
the first record that is incomplete, reports it as `EventFile.truncated` and warns
(`IncompleteEventWarning`), and never returns part of an event. Incomplete means: fewer bytes than
its header or its `record_size` needs; a record header that fails its checks where only zeros
follow (what an operating system crash leaves of blocks it never wrote); or, for the last record,
a payload whose CRC32 does not match (checked at every open: one event's bytes). A record header
that fails its CRC elsewhere is corrupt, an error naming the event and its offset; payloads are
checked with `verify=True`. `EventWriter(..., repair=True)` cuts an incomplete tail off before
appending; without it, a writer refuses such a file.

Importing this module imports neither torch nor NumPy.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import mmap as mmap_module
import os
import struct
import typing
import warnings
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from soagen.runtime import files
from soagen.runtime.errors import (
    CollectionFileError,
    CorruptFileError,
    IncompleteEventWarning,
    InconsistentHeaderError,
    NotACollectionFileError,
    TruncatedFileError,
    WrongLayoutFileError,
)

if typing.TYPE_CHECKING:
    import torch

    from soagen.runtime.buffers import DeviceLike
    from soagen.runtime.collection import Collection

MAGIC = b"\x89SOAEVT\n"
FORMAT_VERSION = 1
# magic, format_version, metadata_length
_FILE_FIELDS = struct.Struct("<8sII")
FILE_HEADER_SIZE = _FILE_FIELDS.size + 4  # 20, with header_crc32
RECORD_MARKER = b"SOAEVENT"
_RECORD_START = struct.Struct("<8sQQ")  # marker, event_index, record_size
_RECORD_LAYOUT = struct.Struct("<QQQ")  # n, byte_size, data_offset
_CRC = struct.Struct("<I")
# Records start at multiples of this, so that their fixed-width fields are aligned.
RECORD_ALIGNMENT = 8
# How much of a cut tail is read at a time to find where its zeros start.
_TAIL_CHUNK = 1 << 20


def record_header_size(layout_count: int) -> int:
    return _RECORD_START.size + layout_count * _RECORD_LAYOUT.size + 2 * _CRC.size


@dataclass(frozen=True, slots=True)
class IncompleteTail:
    """Where an event file stops holding complete events, and why (`EventFile.truncated`)."""

    offset: int  # where the incomplete record starts: the complete events end here
    event_index: int  # the index the incomplete event would have had
    bytes_found: int  # bytes from `offset` to the end of the file
    reason: str

    def __str__(self) -> str:
        return (
            f"event {self.event_index} at offset {self.offset} is incomplete ({self.reason}): "
            f"the {self.bytes_found} bytes from there to the end of the file are not an event"
        )


@dataclass(frozen=True, slots=True)
class _Record:
    offset: int
    size: int
    counts: tuple[int, ...]  # n per layout
    data_offsets: tuple[int, ...]
    byte_sizes: tuple[int, ...]
    payload_crc32: int


def _layout_list(layouts: Sequence[type[Collection]]) -> str:
    return ", ".join(f"{layout.NAME} (layout key {layout.LAYOUT_KEY})" for layout in layouts)


def _header_metadata(layouts: Sequence[type[Collection]]) -> bytes:
    entries = [
        {**files.layout_metadata(layout), "alignment": layout.ALIGNMENT} for layout in layouts
    ]
    return json.dumps({"layouts": entries}, separators=(",", ":")).encode()


def _first_record(metadata_length: int) -> int:
    return files.round_up(FILE_HEADER_SIZE + metadata_length, RECORD_ALIGNMENT)


def _check_layouts_argument(layouts: Sequence[type[Collection]]) -> tuple[type[Collection], ...]:
    declared = tuple(layouts)
    if not declared:
        raise ValueError("an event file needs at least one layout")
    names = [layout.NAME for layout in declared]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(
            f"layouts {', '.join(repeated)} are given more than once: an event holds one "
            f"collection per layout"
        )
    return declared


def _read_file_header(name: str, file: typing.BinaryIO, layouts: Sequence[type[Collection]]) -> int:
    """Check the header of the event file `file` (at its start) against `layouts`; the offset of
    its first record."""
    size = os.fstat(file.fileno()).st_size
    head = file.read(FILE_HEADER_SIZE)
    if head.startswith(files.MAGIC):
        raise NotACollectionFileError(
            f"{name} is a soagen collection file, not an event file: load it with Layout.load(path)"
        )
    version = files.check_prefix(
        name,
        size,
        head,
        magic=MAGIC,
        kind="event file",
        format_version=FORMAT_VERSION,
        header_size=FILE_HEADER_SIZE,
    )
    _, _, metadata_length = _FILE_FIELDS.unpack_from(head)
    (header_crc32,) = _CRC.unpack_from(head, _FILE_FIELDS.size)
    metadata = file.read(metadata_length)
    if len(metadata) != metadata_length:
        raise TruncatedFileError(
            f"{name} is truncated: it holds {size} bytes, but its header needs "
            f"{FILE_HEADER_SIZE + metadata_length}"
        )
    files.check_crc(name, "header", header_crc32, head[: _FILE_FIELDS.size], metadata)
    try:
        stored = [
            files.parse_layout_metadata(entry)[:2]
            for entry in json.loads(metadata.decode())["layouts"]
        ]
    except (ValueError, KeyError, TypeError) as error:
        raise InconsistentHeaderError(
            f"{name}: its header's metadata is not what event file format version {version} "
            f"writes: {error}"
        ) from None
    if stored != [(layout.NAME, layout.LAYOUT_KEY) for layout in layouts]:
        found = ", ".join(f"{layout} (layout key {key})" for layout, key in stored)
        raise WrongLayoutFileError(
            f"{name} holds events of {found}, not of {_layout_list(layouts)}"
        )
    return _first_record(metadata_length)


def _content_end(descriptor: int, start: int, size: int) -> int:
    """The end of the last byte in [start, size) of the file that is not zero (`start` if none)."""
    end = size
    while end > start:
        begin = max(start, end - _TAIL_CHUNK)
        content = os.pread(descriptor, end - begin, begin).rstrip(b"\0")
        if content:
            return begin + len(content)
        end = begin
    return start


def _scan(
    name: str, descriptor: int, first: int, layouts: Sequence[type[Collection]]
) -> tuple[list[_Record], IncompleteTail | None]:
    """Every complete record from `first` on, reading record headers only (and the last record's
    payload), and the incomplete tail after them, if any."""
    size = os.fstat(descriptor).st_size
    header_size = record_header_size(len(layouts))
    layout_fields = struct.Struct("<" + "QQQ" * len(layouts))
    records: list[_Record] = []
    offset = first
    tail: IncompleteTail | None = None
    while offset < size:
        index = len(records)
        subject = f"{name}: event {index} (the record at offset {offset})"
        head = os.pread(descriptor, header_size, offset)
        if len(head) < header_size:
            tail = IncompleteTail(
                offset, index, size - offset, f"its record header needs {header_size} bytes"
            )
            break
        marker, event_index, record_size = _RECORD_START.unpack_from(head)
        payload_crc32, header_crc32 = struct.unpack_from("<II", head, header_size - 8)
        if marker != RECORD_MARKER or zlib.crc32(head[:-4]) != header_crc32:
            content_end = _content_end(descriptor, offset, size)
            if content_end < offset + header_size:
                tail = IncompleteTail(
                    offset,
                    index,
                    size - offset,
                    f"only zeros follow its first {content_end - offset} bytes",
                )
                break
            if marker != RECORD_MARKER:
                raise CorruptFileError(
                    f"{subject} is corrupt: it starts with {marker!r}, not the record marker "
                    f"{RECORD_MARKER!r}"
                )
            files.check_crc(subject, "record header", header_crc32, head[:-4])
        fields = layout_fields.unpack_from(head, _RECORD_START.size)
        counts, byte_sizes, data_offsets = fields[0::3], fields[1::3], fields[2::3]
        _check_record(subject, offset, index, event_index, record_size, layouts, fields)
        if offset + record_size > size:
            tail = IncompleteTail(
                offset, index, size - offset, f"its record header says {record_size} bytes"
            )
            break
        records.append(
            _Record(offset, record_size, counts, data_offsets, byte_sizes, payload_crc32)
        )
        offset += record_size
    if records:
        last = records[-1]
        pieces = [
            os.pread(descriptor, byte_size, data_offset)
            for data_offset, byte_size in zip(last.data_offsets, last.byte_sizes, strict=True)
        ]
        computed = 0
        for piece in pieces:
            computed = zlib.crc32(piece, computed)
        if computed != last.payload_crc32:
            # The last record is where a write cut short by a crash shows: its header may have
            # reached the disk and some of its payload not.
            records.pop()
            tail = IncompleteTail(
                last.offset,
                len(records),
                size - last.offset,
                f"its payload's CRC32 is {computed:#010x}, but its header says "
                f"{last.payload_crc32:#010x}",
            )
    return records, tail


def _check_record(
    subject: str,
    offset: int,
    index: int,
    event_index: int,
    record_size: int,
    layouts: Sequence[type[Collection]],
    fields: tuple[int, ...],
) -> None:
    """Refuse a record header (its CRC matching) that disagrees with itself or the layouts."""
    header_size = record_header_size(len(layouts))
    if event_index != index:
        raise InconsistentHeaderError(
            f"{subject}: its header says it holds event {event_index}, but it is the file's "
            f"record {index}"
        )
    if record_size % RECORD_ALIGNMENT or record_size < header_size:
        raise InconsistentHeaderError(
            f"{subject}: its header says the record is {record_size} bytes, which is not a "
            f"multiple of {RECORD_ALIGNMENT} at least its header's {header_size}"
        )
    end = offset + header_size
    for layout, n, byte_size, data_offset in zip(
        layouts, fields[0::3], fields[1::3], fields[2::3], strict=True
    ):
        expected = layout.byte_size(n)
        if byte_size != expected:
            raise InconsistentHeaderError(
                f"{subject}: its header says {byte_size} bytes for {layout.NAME} with n={n}, but "
                f"{layout.NAME}.byte_size({n}) is {expected}"
            )
        if data_offset % layout.ALIGNMENT or data_offset < end:
            raise InconsistentHeaderError(
                f"{subject}: its header places {layout.NAME}'s buffer at offset {data_offset}, "
                f"which must be a multiple of its alignment {layout.ALIGNMENT} at or after {end}"
            )
        end = data_offset + byte_size
    if end > offset + record_size:
        raise InconsistentHeaderError(
            f"{subject}: its buffers end at offset {end}, after the record's end at "
            f"{offset + record_size}"
        )


def _write_at(descriptor: int, offset: int, data: typing.Any) -> int:
    """Write all of `data` at `offset` (a raw write may take part of it); the offset after it."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = os.pwrite(descriptor, view, offset)
        view, offset = view[written:], offset + written
    return offset


class EventWriter:
    """Appends events to the event file at `path`, whose events hold one collection of each of
    `layouts`, in that order; a new file if there is none.

    An existing file is appended to if its header declares the same layouts (NAME and LAYOUT_KEY,
    in order); an incomplete last event (see the module documentation) is refused unless
    `repair=True`, which cuts it off with an `IncompleteEventWarning` saying how many bytes went.
    Each event is written whole and handed to the operating system at once (a process that dies
    loses no appended event); `sync_every` events are fsynced together, and `close` fsyncs the
    rest (an operating system crash loses at most the events since the last fsync; with
    `sync_every > 1` it may also leave those events' bytes zeroed behind intact headers, which
    only the last record's check at open or `verify=True` catches). One writer at
    a time: a second one is refused (an exclusive `flock`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        layouts: Sequence[type[Collection]],
        *,
        sync_every: int = 1,
        repair: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.layouts = _check_layouts_argument(layouts)
        if sync_every < 1:
            raise ValueError(f"sync_every must be at least 1, got {sync_every}")
        self._sync_every = sync_every
        self._unsynced = 0
        if not os.path.exists(self.path):
            metadata = _header_metadata(self.layouts)
            header = files.header_bytes(
                _FILE_FIELDS.pack(MAGIC, FORMAT_VERSION, len(metadata)), metadata
            )
            # Whole or not at all: a file is never left with half a header. Never over a file
            # another writer made meanwhile: that one may hold it open and append to it.
            files.write_whole(
                self.path,
                header,
                bytes(_first_record(len(metadata)) - len(header)),
                replace=False,
            )
        # Unbuffered: a record that failed part way is cut off with nothing left to flush later.
        file = open(self.path, "r+b", buffering=0)  # noqa: SIM115 - held until close
        try:
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CollectionFileError(
                    f"{self.path} is open in another EventWriter: one writer at a time appends"
                ) from None
            first = _read_file_header(self.path, file, self.layouts)
            records, tail = _scan(self.path, file.fileno(), first, self.layouts)
            if tail is not None:
                if not repair:
                    raise TruncatedFileError(
                        f"{self.path} is cut short: {tail}; pass repair=True to cut those bytes "
                        f"off and append after its {len(records)} complete events"
                    )
                warnings.warn(
                    f"{self.path} is cut short: {tail}; cutting them off (repair=True) to append "
                    f"after its {len(records)} complete events",
                    IncompleteEventWarning,
                    stacklevel=2,
                )
                os.ftruncate(file.fileno(), tail.offset)
                os.fsync(file.fileno())
        except BaseException:
            file.close()
            raise
        self._file: typing.BinaryIO | None = file
        self._end = records[-1].offset + records[-1].size if records else first
        self._count = len(records)

    def __len__(self) -> int:
        """The events in the file: those found when it was opened and those appended since."""
        return self._count

    def append(
        self, event: Mapping[str, Collection] | None = None, /, **collections: Collection
    ) -> int:
        """Append one event, given as a mapping from layout NAME to collection, or by keyword
        (`append(Hits=hits, Tracks=tracks)`), one collection of each layout; its index.

        A whole host collection is written from its buffer; a slice or an accelerator's
        collection is first copied to the host, as `Collection.save` does.
        """
        from soagen.runtime.collection import host_bytes

        file = self._file
        if file is None:
            raise ValueError(f"{self.path}: the EventWriter is closed")
        given = dict(event or {})
        for key, value in collections.items():
            if key in given:
                raise ValueError(f"{key} is given twice (in the mapping and by keyword)")
            given[key] = value
        names = [layout.NAME for layout in self.layouts]
        missing = [name for name in names if name not in given]
        unknown = [name for name in given if name not in names]
        if missing or unknown:
            raise ValueError(
                f"{self.path}: an event holds one collection of each of {', '.join(names)}, but "
                + "; ".join(
                    part
                    for part in (
                        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
                        if missing
                        else "",
                        f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} no layout "
                        f"of the file"
                        if unknown
                        else "",
                    )
                    if part
                )
            )
        buffers = []
        for layout in self.layouts:
            collection = given[layout.NAME]
            kind = type(collection)
            if (getattr(kind, "NAME", None), getattr(kind, "LAYOUT_KEY", None)) != (
                layout.NAME,
                layout.LAYOUT_KEY,
            ):
                raise WrongLayoutFileError(
                    f"{self.path}: events hold a {layout.NAME} (layout key {layout.LAYOUT_KEY}) "
                    f"as {layout.NAME!r}, but a {getattr(kind, 'NAME', kind.__name__)} (layout "
                    f"key {getattr(kind, 'LAYOUT_KEY', None)}) was given"
                )
            data = memoryview(typing.cast(typing.Any, host_bytes(collection))).cast("B")
            buffers.append((collection.size, data))
        start = self._end
        position = start + record_header_size(len(self.layouts))
        fields: list[int] = []
        pieces: list[typing.Any] = []
        payload_crc32 = 0
        for layout, (n, data) in zip(self.layouts, buffers, strict=True):
            data_offset = files.round_up(position, layout.ALIGNMENT)
            pieces += [bytes(data_offset - position), data]
            fields += [n, data.nbytes, data_offset]
            payload_crc32 = zlib.crc32(data, payload_crc32)
            position = data_offset + data.nbytes
        end = files.round_up(position, RECORD_ALIGNMENT)
        pieces.append(bytes(end - position))
        head = (
            _RECORD_START.pack(RECORD_MARKER, self._count, end - start)
            + struct.pack(f"<{len(fields)}Q", *fields)
            + _CRC.pack(payload_crc32)
        )
        try:
            offset = _write_at(file.fileno(), start, head + _CRC.pack(zlib.crc32(head)))
            for piece in pieces:
                offset = _write_at(file.fileno(), offset, piece)
        except BaseException:
            # A record that failed part way (a full disk) must not stay for the next to follow.
            os.ftruncate(file.fileno(), start)
            raise
        self._end = end
        self._count += 1
        self._unsynced += 1
        if self._unsynced >= self._sync_every:
            os.fsync(file.fileno())
            self._unsynced = 0
        return self._count - 1

    def close(self) -> None:
        """Fsync the events not yet synced and close the file (and its lock); closing twice is
        fine."""
        if self._file is None:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()
            self._file = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EventFile:
    """The events of the event file at `path`, whose events hold one collection of each of
    `layouts`, in that order: `len`, `[i]` (a dict from layout NAME to collection), iteration.

    Opening reads the header and every record header once (and the last event's payload, to tell
    a complete one from a write cut short). A file that ends in an incomplete event reads as its
    complete events: `truncated` then says what was cut, and an `IncompleteEventWarning` is
    issued; otherwise `truncated` is None. Events appended after opening are not seen.

    `mmap=True`: each collection wraps the file's mapping read-only, no copy, as
    `Layout.load(path)` gives it (NumPy views only, torch views too with `unsafe_torch_views=True`;
    see `Collection.load`). `mmap=False`: each event is read into new buffers on `device`.
    `verify=True` checks each event's payload CRC32 whenever it is read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        layouts: Sequence[type[Collection]],
        *,
        mmap: bool = True,
        verify: bool = False,
        device: DeviceLike = "cpu",
        unsafe_torch_views: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.layouts = _check_layouts_argument(layouts)
        self._target = files.check_load_options(
            self.path,
            self.layouts,
            mmap=mmap,
            device=device,
            writable=False,
            unsafe_torch_views=unsafe_torch_views,
        )
        self._verify = verify
        self._unsafe_torch_views = unsafe_torch_views
        file = open(self.path, "rb")  # noqa: SIM115 - held until close with mmap=False
        try:
            first = _read_file_header(self.path, file, self.layouts)
            self._records, self.truncated = _scan(self.path, file.fileno(), first, self.layouts)
            self._mapping = (
                mmap_module.mmap(file.fileno(), 0, access=mmap_module.ACCESS_READ) if mmap else None
            )
        except BaseException:
            file.close()
            raise
        self._file: typing.BinaryIO | None = None
        if mmap:
            file.close()  # the mapping holds the file open
        else:
            self._file = file
        self._open = True
        if self.truncated is not None:
            warnings.warn(
                f"{self.path} is cut short: {self.truncated}; its {len(self._records)} complete "
                f"events are read",
                IncompleteEventWarning,
                stacklevel=2,
            )

    @property
    def record_offsets(self) -> tuple[int, ...]:
        """Where each event's record starts in the file."""
        return tuple(record.offset for record in self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[dict[str, Collection]]:
        for index in range(len(self._records)):
            yield self[index]

    def __getitem__(self, index: int) -> dict[str, Collection]:
        if not self._open:
            raise ValueError(f"{self.path}: the EventFile is closed")
        count = len(self._records)
        position = index + count if index < 0 else index
        if not 0 <= position < count:
            raise IndexError(f"{self.path} holds {count} events: there is no event {index}")
        record = self._records[position]
        subject = f"{self.path}: event {position} (the record at offset {record.offset})"
        parts = list(zip(self.layouts, record.counts, record.data_offsets, strict=True))
        if self._mapping is not None:
            whole = memoryview(self._mapping)
            pieces = [
                whole[data_offset : data_offset + byte_size]
                for data_offset, byte_size in zip(
                    record.data_offsets, record.byte_sizes, strict=True
                )
            ]
            if self._verify:
                files.check_crc(subject, "payload", record.payload_crc32, *pieces)
            return {
                layout.NAME: layout.wrap(
                    piece,
                    n,
                    read_only=True,
                    unsafe_torch_views=self._unsafe_torch_views,
                    exact=True,
                )
                for (layout, n, _), piece in zip(parts, pieces, strict=True)
            }
        assert self._file is not None
        event: dict[str, Collection] = {}
        pieces = []
        for layout, n, data_offset in parts:
            event[layout.NAME], data = files.read_copy(
                layout, self.path, self._file.fileno(), n, data_offset
            )
            pieces.append(data)
        if self._verify:
            files.check_crc(subject, "payload", record.payload_crc32, *pieces)
        return {name: collection.to(self._target) for name, collection in event.items()}

    def close(self) -> None:
        """Close the file. Mapped collections already read stay valid: the mapping goes when the
        last of them does."""
        self._open = False
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:
                pass  # collections still view it
            self._mapping = None

    def __enter__(self) -> EventFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EventDataset:
    """A map-style dataset of an event file's events for `torch.utils.data.DataLoader`: item i is
    `EventFile(path, layouts, ...)[i]`, the file's events counted when the dataset is made.

    It implements the protocol a `DataLoader` reads (`len`, `[i]`) without deriving from
    `torch.utils.data.Dataset`, so that importing soagen imports no torch. Each process opens the
    file for itself on its first item (a mapping cannot be pickled into a worker, and workers
    sharing a file offset would race). Mapped events cannot be sent back from a worker either:
    with `num_workers > 0`, collate with `concatenate_events` (or `mmap=False`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        layouts: Sequence[type[Collection]],
        *,
        mmap: bool = True,
        verify: bool = False,
        unsafe_torch_views: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.layouts = tuple(layouts)
        self._mmap, self._verify, self._unsafe_torch_views = mmap, verify, unsafe_torch_views
        self._events: EventFile | None = self._open()
        self._length = len(self._events)
        self._process = os.getpid()

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, Collection]:
        if self._events is None or self._process != os.getpid():
            with warnings.catch_warnings():
                # The opening in the first process warned already.
                warnings.simplefilter("ignore", IncompleteEventWarning)
                self._events = self._open()
            self._process = os.getpid()
        if not -self._length <= index < self._length:
            raise IndexError(f"{self.path} held {self._length} events: there is no event {index}")
        return self._events[index]

    def _open(self) -> EventFile:
        return EventFile(
            self.path,
            self.layouts,
            mmap=self._mmap,
            verify=self._verify,
            unsafe_torch_views=self._unsafe_torch_views,
        )

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_events"] = None
        return state


def collate_events(batch: Sequence[dict[str, Collection]]) -> list[dict[str, Collection]]:
    """A `DataLoader` batch as the list of its events, as they are (no copy)."""
    return list(batch)


@dataclass(frozen=True)
class EventBatch:
    """Events concatenated: per layout NAME, one collection holding every event's elements in
    order, and `offsets[name]`, an int64 tensor [0, n0, n0 + n1, ...]: event i's elements are
    `collections[name][offsets[name][i]:offsets[name][i + 1]]`."""

    collections: dict[str, Collection]
    offsets: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return len(next(iter(self.offsets.values()))) - 1


def concatenate_events(batch: Sequence[Mapping[str, Collection]]) -> EventBatch:
    """A `DataLoader` batch as one new host collection per layout (one copy of each member of each
    event) and its events' offsets. Scalar members hold one value per collection, so they must be
    equal in every event of the batch: a batch whose scalars differ is refused (use
    `collate_events` to keep each event's)."""
    import torch

    if not batch:
        raise ValueError("concatenate_events needs at least one event")
    names = list(batch[0])
    for position, event in enumerate(batch):
        if list(event) != names:
            raise ValueError(
                f"event {position} of the batch holds {', '.join(event)}, but event 0 holds "
                f"{', '.join(names)}"
            )
    collections: dict[str, Collection] = {}
    offsets: dict[str, torch.Tensor] = {}
    for name in names:
        parts = [event[name] for event in batch]
        layout = type(parts[0])
        bounds = [0, *itertools.accumulate(part.size for part in parts)]
        out = layout.allocate(bounds[-1], zero=True)
        for spec in layout.MEMBERS:
            target = out.numpy(spec.name)
            if spec.per_element:
                for part, start, stop in zip(parts, bounds, bounds[1:], strict=False):
                    target[start:stop] = part.numpy(spec.name)
                continue
            first = parts[0].numpy(spec.name)
            for position, part in enumerate(parts[1:], 1):
                if part.numpy(spec.name).tobytes() != first.tobytes():
                    raise ValueError(
                        f"scalar {name}.{spec.name} is {part.numpy(spec.name).tolist()} in event "
                        f"{position} of the batch but {first.tolist()} in event 0: one "
                        f"concatenated collection holds one value; collate with collate_events "
                        f"to keep each event's"
                    )
            target[...] = first
        collections[name] = out
        offsets[name] = torch.tensor(bounds, dtype=torch.int64)
    return EventBatch(collections, offsets)
