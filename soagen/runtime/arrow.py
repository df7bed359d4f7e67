"""Collections as Arrow record batches and Parquet files (the `data` extra: `pip install 'soagen[data]'`).

`to_arrow(collection)` makes a `pyarrow.RecordBatch` of the collection's own elements whose columns,
where Arrow's memory format allows it, are the collection's buffer: each Arrow buffer is a
`pyarrow.foreign_buffer` over a column's address with the collection as its base, so the batch keeps
the collection (and its memory) alive. What is zero-copy and what copies:

| member                                  | Arrow column(s)                                    | copies |
|-----------------------------------------|----------------------------------------------------|--------|
| `column T x` (T not bool)               | `x`: T                                             | no     |
| `column T[k] p` (coefficient-major)     | `p_0` ... `p_{k-1}`: T (`arrays="columns"`)        | no     |
|                                         | `p`: `fixed_size_list<T>[k]` (`arrays="list"`)     | once   |
| `column T[k] adc packed`                | `adc`: `fixed_size_list<T>[k]` (either form)       | no     |
| `column T[r, c] m`                      | `m_0_0`, `m_0_1`, ... (`m_i_j` is `m[:, i, j]`), or `m`: nested fixed-size lists | as above |
| `column bool flag`                      | `flag`: bool                                       | always: Arrow packs booleans into bits |
| `column float16 h`                      | `h`: halffloat                                     | no     |
| `column bfloat16 b`                     | `b`: uint16 bit patterns, field metadata `soagen.dtype: bfloat16` (Arrow has no bfloat16) | no |
| `scalar T s`                            | schema metadata `soagen.scalars` (JSON: dtype, value, little-endian bits in hex) | - |

CMSSW stores an array column coefficient by coefficient (each coefficient a padded column of its
own), so one coefficient's values are contiguous and an element's are not: a fixed-size list, which
needs each element's values together, is a copy, while one Arrow column per coefficient is not. A
packed column stores each element's values together: a fixed-size list over them is zero-copy.
The schema metadata also carries `soagen.layout` (NAME), `soagen.layout_key` and `soagen.alignment`.

`from_arrow(layout, batch_or_table)` copies once into a new aligned buffer, taking either export form
of every array member and tables of any number of chunks, and refuses (`ColumnError`) a missing,
unknown, mis-typed or mis-shaped column, or one with nulls, naming the column, the expected and the
found type. `write_parquet` and `read_parquet` go through `pyarrow.parquet`; the metadata travels in
the file.

Importing this module imports neither pyarrow, torch nor NumPy.
"""

from __future__ import annotations

import json
import math
import os
import typing
from collections.abc import Mapping

from soagen.runtime.errors import ColumnError, DeviceError, MissingPackageError

if typing.TYPE_CHECKING:
    import numpy
    import pyarrow
    from numpy.typing import NDArray

    from soagen.runtime.collection import Collection
    from soagen.runtime.spec import MemberSpec

    _C = typing.TypeVar("_C", bound=Collection)

EXTRA = "data"
LAYOUT_METADATA = "soagen.layout"
LAYOUT_KEY_METADATA = "soagen.layout_key"
ALIGNMENT_METADATA = "soagen.alignment"
SCALARS_METADATA = "soagen.scalars"
# On a field: the soagen dtype its values hold when Arrow has no such type (bfloat16 as uint16 bits).
DTYPE_METADATA = "soagen.dtype"
ARRAY_FORMS = ("columns", "list")

# The Arrow type of each dtype, by pyarrow factory name.
_ARROW_TYPES = {
    "bool": "bool_",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "bfloat16": "uint16",
    "float32": "float32",
    "float64": "float64",
}


def import_pyarrow() -> typing.Any:
    """The `pyarrow` module, or a MissingPackageError naming the extra to install."""
    try:
        import pyarrow
    except ImportError as error:
        raise MissingPackageError(
            f"Arrow and Parquet conversions need the pyarrow package ({error}); install it with "
            f"pip install 'soagen[{EXTRA}]'"
        ) from None
    return pyarrow


def coefficient_name(member: str, index: tuple[int, ...]) -> str:
    """The Arrow column of one coefficient of an array member: `p_0`, `m_1_2` (`m[:, 1, 2]`)."""
    return "_".join([member, *map(str, index)])


def coefficients(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every index of an array member's shape, in row-major order."""
    import numpy as np

    return [tuple(int(i) for i in index) for index in np.ndindex(*shape)]


def _coefficient(index: tuple[int, ...]) -> tuple[slice | int, ...]:
    """The NumPy index of one coefficient's values in a member's `[n, *shape]` view."""
    return (slice(None), *index)


def arrow_type(pa: typing.Any, dtype: str, shape: tuple[int, ...] = ()) -> pyarrow.DataType:
    """The Arrow type of a member's values: its dtype's, in nested fixed-size lists for `shape`."""
    found = getattr(pa, _ARROW_TYPES[dtype])()
    for extent in reversed(shape):
        found = pa.list_(found, extent)
    return found


def _describe(pa: typing.Any, found: pyarrow.DataType) -> str:
    """An Arrow type in the terms a member is declared in: `float32[3]` for nested fixed-size lists."""
    shape = []
    while pa.types.is_fixed_size_list(found):
        shape.append(found.list_size)
        found = found.value_type
    return f"{found}{list(shape) if shape else ''}"


def _field(pa: typing.Any, name: str, spec: MemberSpec, shape: tuple[int, ...]) -> pyarrow.Field:
    metadata = {DTYPE_METADATA: spec.dtype} if spec.dtype == "bfloat16" else None
    return pa.field(name, arrow_type(pa, spec.dtype, shape), nullable=False, metadata=metadata)


def _values(pa: typing.Any, view: NDArray[typing.Any], dtype: str, owner: object) -> pyarrow.Array:
    """A flat NumPy view as an Arrow array over the same memory, `owner` keeping it alive; bools
    (bit-packed in Arrow) and strided views are copied."""
    import numpy as np

    kind = arrow_type(pa, dtype)
    if dtype == "bool":
        return pa.array(view, type=kind)
    if not view.flags.c_contiguous:
        view = np.ascontiguousarray(view)
        owner = view
    memory = pa.foreign_buffer(view.ctypes.data, view.nbytes, base=owner)
    return pa.Array.from_buffers(kind, len(view), [None, memory], null_count=0)


def _listed(
    pa: typing.Any, view: NDArray[typing.Any], spec: MemberSpec, owner: object
) -> pyarrow.Array:
    """An array member `[n, *shape]` as nested fixed-size lists: zero-copy when each element's values
    are contiguous (packed), else over one row-major copy."""
    import numpy as np

    if not view.flags.c_contiguous:
        view = np.ascontiguousarray(view)
        owner = view
    array = _values(pa, view.reshape(-1), spec.dtype, owner)
    for extent in reversed(spec.shape):
        array = pa.FixedSizeListArray.from_arrays(array, extent)
    return array


def _scalar_entry(dtype: str, value: NDArray[typing.Any]) -> dict[str, object]:
    """A scalar as the metadata keeps it: its exact bytes, and its value for readers."""
    import numpy as np

    bits = value.tobytes()
    if dtype == "bfloat16":
        # NumPy holds bfloat16 as its uint16 pattern: the top half of the float32 of equal value.
        number: object = float(np.array(int(value) << 16, dtype=np.uint32).view(np.float32))
    else:
        number = value.item()
    if isinstance(number, float) and not math.isfinite(number):
        number = repr(number)  # JSON has no NaN or infinity
    return {"dtype": dtype, "value": number, "bits": bits.hex()}


def to_arrow(collection: Collection, *, arrays: str = "columns") -> pyarrow.RecordBatch:
    """The collection's elements as a RecordBatch over its buffer (see the module documentation).

    `arrays="columns"` exports each coefficient-major array member as one column per coefficient
    (zero-copy); `arrays="list"` as one fixed-size-list column (one copy). Packed members are
    fixed-size lists either way, zero-copy.
    """
    pa = import_pyarrow()
    layout = type(collection)
    if arrays not in ARRAY_FORMS:
        raise ValueError(
            f"arrays must be one of {', '.join(map(repr, ARRAY_FORMS))}, got {arrays!r}"
        )
    if collection.device.type != "cpu":
        raise DeviceError(
            f"to_arrow() shares host memory, but this {layout.NAME} is on {collection.device}: "
            f"copy it with .to('cpu') first"
        )
    views = collection.numpy()
    fields: list[pyarrow.Field] = []
    columns: list[pyarrow.Array] = []
    scalars: dict[str, dict[str, object]] = {}
    for spec in layout.MEMBERS:
        view = views[spec.name]
        if not spec.per_element:
            scalars[spec.name] = _scalar_entry(spec.dtype, view)
        elif spec.shape and spec.kind != "packed" and arrays == "columns":
            for index in coefficients(spec.shape):
                fields.append(_field(pa, coefficient_name(spec.name, index), spec, ()))
                columns.append(_values(pa, view[_coefficient(index)], spec.dtype, collection))
        else:
            fields.append(_field(pa, spec.name, spec, spec.shape))
            columns.append(_listed(pa, view, spec, collection))
    names = [field.name for field in fields]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise ColumnError(
            f"{layout.NAME} exports two columns named {', '.join(map(repr, clashes))} (a member "
            f"and a coefficient of another): export it with arrays='list'"
        )
    metadata = {
        LAYOUT_METADATA: layout.NAME,
        LAYOUT_KEY_METADATA: layout.LAYOUT_KEY,
        ALIGNMENT_METADATA: str(layout.ALIGNMENT),
        SCALARS_METADATA: json.dumps(scalars, separators=(",", ":")),
    }
    schema = pa.schema(fields, metadata=metadata)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _fill(
    pa: typing.Any,
    layout: str,
    column: str,
    found: pyarrow.DataType,
    chunks: list[pyarrow.Array],
    dtype: str,
    shape: tuple[int, ...],
    target: NDArray[typing.Any],
) -> None:
    """Copy one Arrow column, chunk by chunk, into `target` (a view `[n, *shape]` of the buffer)."""
    expected = arrow_type(pa, dtype, shape)
    if not found.equals(expected):
        raise ColumnError(
            f"column {column!r} of {layout} must hold {dtype}{list(shape) if shape else ''} "
            f"(Arrow {_describe(pa, expected)}), found Arrow {_describe(pa, found)}"
        )
    position = 0
    for chunk in chunks:
        values = chunk
        for _ in range(len(shape) + 1):
            if values.null_count:
                raise ColumnError(
                    f"column {column!r} of {layout} holds {values.null_count} nulls, which a "
                    f"{dtype} member cannot: fill them first (pyarrow.compute.fill_null)"
                )
            if pa.types.is_fixed_size_list(values.type):
                # flatten(), unlike .values, starts at the chunk's own offset.
                values = values.flatten()
        array = values.to_numpy(zero_copy_only=False).reshape((len(chunk), *shape))
        target[position : position + len(chunk)] = array
        position += len(chunk)


def _columns_of(pa: typing.Any, data: object) -> tuple[pyarrow.Schema, dict[str, list[typing.Any]]]:
    if isinstance(data, pa.RecordBatch):
        return data.schema, {name: [data.column(i)] for i, name in enumerate(data.schema.names)}
    if isinstance(data, pa.Table):
        return data.schema, {
            name: list(data.column(i).chunks) for i, name in enumerate(data.schema.names)
        }
    raise TypeError(
        f"from_arrow takes a pyarrow.RecordBatch or pyarrow.Table, got {type(data).__name__}"
    )


def from_arrow(
    layout: type[_C], data: object, *, scalars: Mapping[str, object] | None = None
) -> _C:
    """A new `layout` collection holding a copy of a RecordBatch's or Table's columns.

    Array members are read from either export form (one column per coefficient, or one fixed-size
    list column). Scalars are read from `scalars` (member name -> number) or else from the schema
    metadata `to_arrow` writes; a scalar in neither is refused.
    """
    pa = import_pyarrow()
    import numpy as np

    schema, columns = _columns_of(pa, data)
    names = list(schema.names)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ColumnError(f"the Arrow data has two columns named {', '.join(map(repr, twice))}")
    out = layout.allocate(int(typing.cast(typing.Any, data).num_rows), zero=True)
    targets = out.numpy()
    used: set[str] = set()
    for spec in layout.MEMBERS:
        if not spec.per_element:
            continue
        target = targets[spec.name]
        if spec.name in columns:
            found = schema.field(spec.name).type
            _fill(
                pa,
                layout.NAME,
                spec.name,
                found,
                columns[spec.name],
                spec.dtype,
                spec.shape,
                target,
            )
            used.add(spec.name)
            continue
        split = {coefficient_name(spec.name, index): index for index in coefficients(spec.shape)}
        present = [name for name in split if name in columns]
        if not spec.shape or not present:
            also = f" (or its coefficients {', '.join(split)})" if spec.shape else ""
            raise ColumnError(
                f"the Arrow data has no column {spec.name!r}{also}, a member of {layout.NAME}"
            )
        if len(present) != len(split):
            missing = [name for name in split if name not in columns]
            raise ColumnError(
                f"the Arrow data has coefficients {', '.join(present)} of {layout.NAME}'s "
                f"{spec.dtype}{list(spec.shape)} member {spec.name!r} but not "
                f"{', '.join(missing)}"
            )
        for name, index in split.items():
            found = schema.field(name).type
            part = target[_coefficient(index)]
            _fill(pa, layout.NAME, name, found, columns[name], spec.dtype, (), part)
            used.add(name)
    unknown = [name for name in names if name not in used]
    if unknown:
        raise ColumnError(
            f"{layout.NAME} has no member for column {', '.join(map(repr, unknown))}: select the "
            f"columns it holds first (table.select([...]))"
        )
    metadata = schema.metadata or {}
    stored = json.loads(metadata.get(SCALARS_METADATA.encode(), b"{}"))
    given = dict(scalars or {})
    specs = {spec.name: spec for spec in layout.MEMBERS if not spec.per_element}
    extra = [name for name in given if name not in specs]
    if extra:
        raise ColumnError(
            f"{layout.NAME} has no scalar {', '.join(map(repr, extra))}; its scalars are "
            f"{', '.join(specs) or 'none'}"
        )
    for name, spec in specs.items():
        if name in given:
            out.member(name).fill_(typing.cast(typing.Any, given[name]))
        elif name in stored:
            entry = stored[name]
            if entry.get("dtype") != spec.dtype:
                raise ColumnError(
                    f"scalar {name!r} of {layout.NAME} is {spec.dtype}, but the Arrow metadata "
                    f"({SCALARS_METADATA}) holds a {entry.get('dtype')}"
                )
            value: numpy.ndarray[typing.Any, typing.Any] = targets[name]
            np.copyto(value, np.frombuffer(bytes.fromhex(entry["bits"]), dtype=value.dtype)[0])
        else:
            raise ColumnError(
                f"scalar {name!r} of {layout.NAME} is neither in the Arrow schema metadata "
                f"({SCALARS_METADATA}) nor given: pass scalars={{{name!r}: value}}"
            )
    return out


def write_parquet(
    collection: Collection,
    path: str | os.PathLike[str],
    *,
    arrays: str = "columns",
    **options: typing.Any,
) -> None:
    """Write `to_arrow(collection, arrays=arrays)` to a Parquet file; `options` go to
    `pyarrow.parquet.write_table` (compression, row_group_size, ...)."""
    pa = import_pyarrow()
    import pyarrow.parquet as pq

    batch = to_arrow(collection, arrays=arrays)
    pq.write_table(pa.Table.from_batches([batch]), os.fspath(path), **options)


def read_parquet(
    layout: type[_C],
    path: str | os.PathLike[str],
    *,
    scalars: Mapping[str, object] | None = None,
) -> _C:
    """A new `layout` collection read from a Parquet file, as `from_arrow` reads its table."""
    import_pyarrow()
    import pyarrow.parquet as pq

    return from_arrow(layout, pq.read_table(os.fspath(path)), scalars=scalars)
