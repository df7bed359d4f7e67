"""Collection files: one collection's buffer on disk, with a header that says what it holds.

`Collection.save(path)` writes, and `Layout.load(path, ...)` reads, a file made of a fixed
little-endian header, a UTF-8 JSON metadata part, zero padding, and the buffer's bytes exactly as
`Layout.byte_size(n)` lays them out:

| offset | size | field            | meaning                                                               |
|-------:|-----:|------------------|-----------------------------------------------------------------------|
|      0 |    8 | magic            | `b"\\x89SOAGEN\\n"` (the high byte and newline catch text-mode copies) |
|      8 |    4 | format_version   | `1`; a reader refuses a newer version                                 |
|     12 |    4 | flags            | bit 0: `data_crc32` is the CRC of the bytes now in the file           |
|     16 |    4 | alignment        | the layout's `ALIGNMENT` in bytes                                     |
|     20 |    4 | metadata_length  | bytes of the JSON metadata that starts at offset 56                   |
|     24 |    8 | n                | element count                                                         |
|     32 |    8 | byte_size        | `Layout.byte_size(n)`: bytes of the buffer                            |
|     40 |    8 | data_offset      | where the buffer starts: a multiple of `alignment`                    |
|     48 |    4 | data_crc32       | `zlib.crc32` of the buffer (checked by `load(verify=True)`)           |
|     52 |    4 | header_crc32     | `zlib.crc32` of bytes 0-51 and the metadata (checked on every load)   |
|     56 |    - | metadata         | JSON: `layout` (NAME), `layout_key` (LAYOUT_KEY), `schema`, `members` |

The file ends where the buffer does: its size is exactly `data_offset + byte_size`.

A mapped buffer starts at the mapping's address plus `data_offset`. A mapping starts on a page
boundary, so a `data_offset` that is a multiple of the alignment places the buffer aligned as long as
the alignment is at most the page size; larger alignments load with `mmap=False` only.

A mapping reads the file's pages for as long as it lives: `save` replaces a file by a rename, never
in place, since cutting a mapped file short makes reads of the lost pages kill the process (SIGBUS).

Importing this module imports neither torch nor NumPy.
"""

from __future__ import annotations

import json
import mmap as mmap_module
import os
import secrets
import struct
import typing
import zlib
from dataclasses import dataclass

from soagen.runtime.errors import (
    CollectionFileError,
    CorruptFileError,
    DeviceError,
    InconsistentHeaderError,
    MisalignedBufferError,
    NewerFormatError,
    NotACollectionFileError,
    TruncatedFileError,
    WrongLayoutFileError,
)

if typing.TYPE_CHECKING:
    import torch

    from soagen.runtime.buffers import DeviceLike
    from soagen.runtime.collection import Collection

    _C = typing.TypeVar("_C", bound=Collection)

MAGIC = b"\x89SOAGEN\n"
FORMAT_VERSION = 1
# magic, format_version, flags, alignment, metadata_length, n, byte_size, data_offset, data_crc32
_FIELDS = struct.Struct("<8sIIIIQQQI")
_HEADER_CRC = struct.Struct("<I")
FIXED_HEADER_SIZE = _FIELDS.size + _HEADER_CRC.size  # 56
# Bit 0 of `flags`. Cleared when the file is mapped writable: writes through the mapping change the
# bytes without updating the checksum, and a verify must not then call the file corrupt.
CHECKSUM_CURRENT = 1
_KNOWN_FLAGS = CHECKSUM_CURRENT
_FLAGS_OFFSET = 12
_METADATA_LENGTH_OFFSET = 20


# (name, kind, dtype, shape) of every member of a layout.
Members = tuple[tuple[str, str, str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class FileHeader:
    """What a collection file's header says, read by `read_header` without touching the buffer."""

    format_version: int
    checksum_current: bool
    alignment: int
    n: int
    byte_size: int
    data_offset: int
    data_crc32: int
    layout: str
    layout_key: str
    # The SCHEMA attribute of the class that saved it (where its schema was read from): provenance only.
    schema: str
    # (name, kind, dtype, shape) of every member: what LAYOUT_KEY digests, spelled out, so that the
    # file says what its bytes are without the generated class.
    members: Members


def _fixed_header(
    flags: int,
    alignment: int,
    metadata_length: int,
    n: int,
    byte_size: int,
    data_offset: int,
    data_crc32: int,
) -> bytes:
    return _FIELDS.pack(
        MAGIC,
        FORMAT_VERSION,
        flags,
        alignment,
        metadata_length,
        n,
        byte_size,
        data_offset,
        data_crc32,
    )


def header_bytes(fields: bytes, metadata: bytes) -> bytes:
    """The fixed fields, their CRC (which covers the metadata too) and the metadata."""
    crc = zlib.crc32(metadata, zlib.crc32(fields))
    return fields + _HEADER_CRC.pack(crc) + metadata


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def layout_metadata(layout: type[Collection]) -> dict[str, typing.Any]:
    """What a file says about a layout it holds, as JSON: `layout` (NAME), `layout_key`, `schema`
    and `members`."""
    # Generated classes carry their schema's path (SCHEMA), not its text, so no digest of the
    # text can be stored: the members, spelled out as LAYOUT_KEY digests them, say what the bytes
    # are instead, and the key is what `load` compares (a schema edit that leaves the layout alone,
    # a new model or comment, does not make old files unreadable).
    return {
        "layout": layout.NAME,
        "layout_key": layout.LAYOUT_KEY,
        "schema": layout.SCHEMA,
        "members": [
            [member.name, member.kind, member.dtype, list(member.shape)]
            for member in layout.MEMBERS
        ],
    }


def parse_layout_metadata(fields: typing.Any) -> tuple[str, str, str, Members]:
    """`layout_metadata`'s (layout, layout_key, schema, members) read back; a `ValueError`,
    `KeyError` or `TypeError` where `fields` is not what it writes."""
    members = tuple(
        (str(member), str(kind), str(dtype), tuple(int(extent) for extent in shape))
        for member, kind, dtype, shape in fields["members"]
    )
    return str(fields["layout"]), str(fields["layout_key"]), str(fields["schema"]), members


def save(layout: type[Collection], n: int, data: typing.Any, path: str | os.PathLike[str]) -> None:
    """Write `data` (the `byte_size(n)` bytes of a compact host buffer of `layout`) to `path`.

    The file is written whole and renamed over `path` (`write_whole`): a process that has the old
    file mapped keeps its pages (truncating a mapped file in place kills its readers with SIGBUS),
    and a crash leaves no half-written file under the name.
    """
    payload = memoryview(data).cast("B")
    byte_size = layout.byte_size(n)
    if payload.nbytes != byte_size:
        raise InconsistentHeaderError(
            f"{os.fspath(path)}: {payload.nbytes} bytes given for {layout.NAME} with n={n}, which "
            f"needs {byte_size}"
        )
    metadata = json.dumps(layout_metadata(layout), separators=(",", ":")).encode()
    alignment = layout.ALIGNMENT
    data_offset = round_up(FIXED_HEADER_SIZE + len(metadata), alignment)
    fields = _fixed_header(
        CHECKSUM_CURRENT,
        alignment,
        len(metadata),
        n,
        byte_size,
        data_offset,
        zlib.crc32(payload),
    )
    header = header_bytes(fields, metadata)
    write_whole(path, header, bytes(data_offset - len(header)), payload)


def write_whole(path: str | os.PathLike[str], *pieces: typing.Any, replace: bool = True) -> None:
    """Make `path` a file of the bytes of `pieces`, written under a temporary name in the same
    folder and renamed over it, so that it never holds only some of them. `replace=False` leaves
    a file that is already there (made meanwhile by another process) as it is."""
    target = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(target))
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            for piece in pieces:
                file.write(piece)
            file.flush()
            # Before the rename: otherwise a crash may leave the new name over unwritten blocks.
            os.fsync(file.fileno())
        if replace:
            os.replace(temporary, target)
        else:
            try:
                os.link(temporary, target)  # fails where the name exists, unlike a rename
            except FileExistsError:
                pass
            os.unlink(temporary)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def read_header(path: str | os.PathLike[str]) -> FileHeader:
    """The header of the collection file at `path`, checked against itself and the file's size."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(FIXED_HEADER_SIZE)
        header = _parse_header(os.fspath(path), size, head, file)
    return header


def check_prefix(
    name: str,
    size: int,
    head: bytes,
    *,
    magic: bytes,
    kind: str,
    format_version: int,
    header_size: int,
) -> int:
    """The format version of the `kind` of file (magic, then a little-endian u32 version) whose
    first `header_size` bytes, or fewer in a short file of `size` bytes, are `head`: refused
    unless the magic is `magic`, the version one this soagen reads, and the fixed header whole."""
    if head[: len(magic)] != magic[: len(head)]:
        raise NotACollectionFileError(
            f"{name} is not a soagen {kind}: it starts with {head[: len(magic)]!r}, not the magic "
            f"bytes {magic!r}"
        )
    truncated = TruncatedFileError(
        f"{name} is truncated: it holds {size} bytes, but the header alone needs {header_size}"
    )
    if len(head) < len(magic) + 4:
        raise truncated
    (version,) = struct.unpack_from("<I", head, len(magic))
    if version > format_version:
        raise NewerFormatError(
            f"{name} was written in {kind} format version {version}, and this soagen reads "
            f"versions up to {format_version}: read it with a newer soagen"
        )
    if version < 1:
        raise InconsistentHeaderError(
            f"{name} declares format version {version}, which never existed"
        )
    if len(head) < header_size:
        raise truncated
    return typing.cast(int, version)


def _parse_header(name: str, size: int, head: bytes, file: typing.BinaryIO) -> FileHeader:
    """The header whose first FIXED_HEADER_SIZE bytes (or fewer, in a short file) are `head`;
    `file` stands just after them, at the metadata."""
    version = check_prefix(
        name,
        size,
        head,
        magic=MAGIC,
        kind="collection file",
        format_version=FORMAT_VERSION,
        header_size=FIXED_HEADER_SIZE,
    )
    (
        _,
        _,
        flags,
        alignment,
        metadata_length,
        n,
        byte_size,
        data_offset,
        data_crc32,
    ) = _FIELDS.unpack_from(head)
    (header_crc32,) = _HEADER_CRC.unpack_from(head, _FIELDS.size)
    metadata_end = FIXED_HEADER_SIZE + metadata_length
    if size < metadata_end:
        raise TruncatedFileError(
            f"{name} is truncated: it holds {size} bytes, but its header needs {metadata_end}"
        )
    metadata = file.read(metadata_length)
    if len(metadata) != metadata_length:
        raise TruncatedFileError(
            f"{name} is truncated: it holds {FIXED_HEADER_SIZE + len(metadata)} bytes, but its "
            f"header needs {metadata_end}"
        )
    check_crc(name, "header", header_crc32, head[: _FIELDS.size], metadata)
    try:
        layout, layout_key, schema, members = parse_layout_metadata(json.loads(metadata.decode()))
    except (ValueError, KeyError, TypeError) as error:
        raise InconsistentHeaderError(
            f"{name}: its header's metadata is not what format version {version} writes: {error}"
        ) from None
    if flags & ~_KNOWN_FLAGS:
        raise InconsistentHeaderError(
            f"{name}: its header sets flags {flags:#x}, of which format version {version} knows "
            f"only {_KNOWN_FLAGS:#x}"
        )
    if alignment <= 0 or alignment & (alignment - 1):
        raise InconsistentHeaderError(
            f"{name}: its header's alignment {alignment} is not a power of two"
        )
    if data_offset < metadata_end or data_offset % alignment:
        raise InconsistentHeaderError(
            f"{name}: its header places the buffer at offset {data_offset}, which must be a "
            f"multiple of its alignment {alignment} at or after the header's end ({metadata_end})"
        )
    expected = data_offset + byte_size
    if size < expected:
        raise TruncatedFileError(
            f"{name} is truncated: it holds {size} bytes, but its header ({layout} with n={n}, "
            f"{byte_size} bytes at offset {data_offset}) needs {expected}"
        )
    if size > expected:
        raise InconsistentHeaderError(
            f"{name} holds {size} bytes, {size - expected} more than its header ({layout} with "
            f"n={n}, {byte_size} bytes at offset {data_offset}) accounts for"
        )
    return FileHeader(
        format_version=version,
        checksum_current=bool(flags & CHECKSUM_CURRENT),
        alignment=alignment,
        n=n,
        byte_size=byte_size,
        data_offset=data_offset,
        data_crc32=data_crc32,
        layout=layout,
        layout_key=layout_key,
        schema=schema,
        members=members,
    )


def _check_layout(name: str, header: FileHeader, layout: type[Collection]) -> None:
    if (header.layout, header.layout_key) != (layout.NAME, layout.LAYOUT_KEY):
        raise WrongLayoutFileError(
            f"{name} holds a {header.layout} (layout key {header.layout_key}), not a "
            f"{layout.NAME} (layout key {layout.LAYOUT_KEY})"
            + (
                ": the layout changed since the file was saved"
                if header.layout == layout.NAME
                else ""
            )
        )
    # The layout key digests the alignment and members, so these can differ only in a header
    # that disagrees with itself.
    if header.alignment != layout.ALIGNMENT:
        raise InconsistentHeaderError(
            f"{name}: its header says alignment {header.alignment}, but its layout key "
            f"{header.layout_key} is that of {layout.NAME}, aligned to {layout.ALIGNMENT}"
        )
    expected = layout.byte_size(header.n)
    if header.byte_size != expected:
        raise InconsistentHeaderError(
            f"{name}: its header says {header.byte_size} bytes for {layout.NAME} with "
            f"n={header.n}, but {layout.NAME}.byte_size({header.n}) is {expected}"
        )


def _check_checksum(name: str, header: FileHeader, data: typing.Any) -> None:
    if not header.checksum_current:
        raise CollectionFileError(
            f"{name} was mapped writable after it was saved, so its header holds no checksum of "
            f"its current bytes: load it with verify=False, or save it again to record one"
        )
    check_crc(name, "buffer", header.data_crc32, data)


def check_crc(subject: str, part: str, expected: int, *pieces: typing.Any) -> None:
    """Refuse `subject`'s `part`, the bytes of `pieces` one after the other, unless their CRC32
    is `expected`."""
    computed = 0
    for piece in pieces:
        computed = zlib.crc32(piece, computed)
    if computed != expected:
        raise CorruptFileError(
            f"{subject} is corrupt: its {part}'s CRC32 is {computed:#010x}, but the header says "
            f"{expected:#010x}"
        )


def load(
    layout: type[_C],
    path: str | os.PathLike[str],
    *,
    mmap: bool,
    device: DeviceLike,
    writable: bool,
    verify: bool,
    unsafe_torch_views: bool,
) -> _C:
    """Read or map the collection file at `path` as a `layout` (see `Collection.load`)."""
    name = os.fspath(path)
    target = check_load_options(
        name,
        (layout,),
        mmap=mmap,
        device=device,
        writable=writable,
        unsafe_torch_views=unsafe_torch_views,
    )
    with open(path, "r+b") if mmap and writable else open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        header = _parse_header(name, size, file.read(FIXED_HEADER_SIZE), file)
        _check_layout(name, header, layout)
        if mmap:
            return _map(layout, name, header, file, writable, verify, unsafe_torch_views)
        out, data = read_copy(layout, name, file.fileno(), header.n, header.data_offset)
    if verify:
        _check_checksum(name, header, data)
    return out.to(target)


def check_load_options(
    name: str,
    layouts: typing.Iterable[type[Collection]],
    *,
    mmap: bool,
    device: DeviceLike,
    writable: bool,
    unsafe_torch_views: bool,
) -> torch.device:
    """The device to load `layouts`' buffers from the file `name` onto, refusing options that do
    not go together (see `Collection.load`)."""
    from soagen.runtime import buffers

    target = buffers.as_device(device)
    if mmap:
        if target.type != "cpu":
            raise DeviceError(
                f"{name}: mmap=True maps the file into host memory, but device={str(target)!r} "
                f"was asked for: load it with mmap=False to read it onto that device"
            )
        if unsafe_torch_views and writable:
            raise ValueError(
                "unsafe_torch_views=True applies to read-only mappings; writable=True gives torch "
                "views already"
            )
        for layout in layouts:
            if layout.ALIGNMENT > mmap_module.PAGESIZE:
                raise MisalignedBufferError(
                    f"{name}: {layout.NAME} needs its buffer aligned to {layout.ALIGNMENT} bytes, "
                    f"but a mapping is only sure to start on a {mmap_module.PAGESIZE}-byte page: "
                    f"load it with mmap=False"
                )
    elif writable or unsafe_torch_views:
        raise ValueError(
            "writable=True and unsafe_torch_views=True apply to mmap=True: with mmap=False the "
            "collection is a writable copy, and writes to it never reach the file"
        )
    return target


def read_copy(
    layout: type[_C], name: str, descriptor: int, n: int, offset: int
) -> tuple[_C, memoryview]:
    """A new host collection of n elements read from the file's bytes at `offset` (positioned
    reads: the descriptor's offset is left alone), and its buffer's bytes (to check a CRC over
    without another copy)."""
    out = layout.allocate(n)
    data = memoryview(typing.cast(typing.Any, out.buffer.numpy()))
    byte_size = data.nbytes
    read = 0
    while read < byte_size:
        # A single read returns at most about 2 GiB on Linux.
        got = os.preadv(descriptor, [data[read:]], offset + read)
        if not got:
            raise TruncatedFileError(
                f"{name} is truncated: {read} of its {byte_size} buffer bytes at offset {offset} "
                f"could be read"
            )
        read += got
    return out, data


def _map(
    layout: type[_C],
    name: str,
    header: FileHeader,
    file: typing.BinaryIO,
    writable: bool,
    verify: bool,
    unsafe_torch_views: bool,
) -> _C:
    access = mmap_module.ACCESS_WRITE if writable else mmap_module.ACCESS_READ
    mapping = mmap_module.mmap(file.fileno(), 0, access=access)
    data = memoryview(mapping)[header.data_offset : header.data_offset + header.byte_size]
    try:
        if verify:
            _check_checksum(name, header, data)
        if writable and header.checksum_current:
            # Writes through the mapping change the bytes and not the checksum: the file says so.
            fields = bytearray(mapping[: _FIELDS.size])
            (flags,) = struct.unpack_from("<I", fields, _FLAGS_OFFSET)
            struct.pack_into("<I", fields, _FLAGS_OFFSET, flags & ~CHECKSUM_CURRENT)
            (metadata_length,) = struct.unpack_from("<I", fields, _METADATA_LENGTH_OFFSET)
            metadata = mapping[FIXED_HEADER_SIZE : FIXED_HEADER_SIZE + metadata_length]
            mapping[:FIXED_HEADER_SIZE] = header_bytes(bytes(fields), metadata)[:FIXED_HEADER_SIZE]
        return layout.wrap(
            data,
            header.n,
            read_only=not writable,
            unsafe_torch_views=unsafe_torch_views,
            exact=True,
        )
    except BaseException:
        data.release()
        mapping.close()
        raise
