"""Collections as jagged awkward arrays (the `data` extra: `pip install 'soagen[data]'`).

An event-based file (a ROOT TTree read by uproot, say) holds, per event, a list of objects: jets,
tracks, hits. A collection holds all of them, one element per object, and NumPy int64 offsets say
which events own which elements: event i's objects are elements `offsets[i]:offsets[i + 1]`.

`from_awkward(layout, array)` takes either form uproot gives:
- jagged records, `N * var * {pt: float32, eta: float32, ...}` (`ak.zip({"pt": ..., "eta": ...})`),
  whose fields are exactly the layout's columns;
- records of jagged fields named with a prefix, `N * {nJet: int32, Jet_pt: var * float32, ...}`
  (`tree.arrays(filter_name="Jet_*")`) with `prefix="Jet_"`: the fields `prefix + member` are read,
  other fields are left alone.
It copies each field's values once into a new buffer (`ak.to_numpy` of the flattened field may
copy first where the lists do not lie back to back). Array members take fields of fixed-size inner
lists (`var * 3 * float32`); bfloat16 members take uint16 bit patterns (awkward and NumPy have no
bfloat16); scalars come from `scalars=` or the array's `attrs` that `to_awkward` writes.

`collection.to_awkward(offsets)` is the inverse: a `N * var * {...}` array whose plain and packed
columns are `ak.contents.NumpyArray`s over the buffer's NumPy views (zero-copy: the awkward array
keeps them, and through them the buffer, alive); coefficient-major array members are copied once
into row-major order, since awkward's regular dimensions need each element's values together.
bfloat16 columns come out as their uint16 bit patterns. Scalars go to `attrs["soagen_scalars"]`.

Importing this module imports neither awkward, torch nor NumPy.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping

from soagen.runtime.errors import ColumnError, DeviceError, ElementCountError, MissingPackageError

if typing.TYPE_CHECKING:
    import awkward
    import numpy
    from numpy.typing import NDArray

    from soagen.runtime.collection import Collection

    _C = typing.TypeVar("_C", bound=Collection)

EXTRA = "data"
SCALARS_ATTRIBUTE = "soagen_scalars"


def import_awkward() -> typing.Any:
    """The `awkward` module, or a MissingPackageError naming the extra to install."""
    try:
        import awkward
    except ImportError as error:
        raise MissingPackageError(
            f"awkward array conversions need the awkward package ({error}); install it with "
            f"pip install 'soagen[{EXTRA}]'"
        ) from None
    return awkward


def _scalar_value(dtype: str, value: NDArray[typing.Any]) -> object:
    import numpy as np

    if dtype == "bfloat16":
        # NumPy holds bfloat16 as its uint16 pattern: the top half of the float32 of equal value.
        return float(np.array(int(value) << 16, dtype=np.uint32).view(np.float32))
    return value.item()


def _check_offsets(layout: str, size: int, offsets: object) -> NDArray[numpy.int64]:
    import numpy as np

    found = np.asarray(offsets)
    if found.ndim != 1 or len(found) == 0 or found.dtype.kind not in "iu":
        raise ElementCountError(
            f"offsets must be a 1-D integer array of events + 1 entries, got "
            f"{found.dtype} of shape {list(found.shape)}"
        )
    found = found.astype(np.int64, copy=False)
    falling = np.flatnonzero(np.diff(found) < 0)
    if found[0] != 0 or found[-1] != size or len(falling):
        where = f", and falls after entry {int(falling[0])}" if len(falling) else ""
        raise ElementCountError(
            f"offsets must rise from 0 to the {layout}'s size {size}, but run from "
            f"{int(found[0])} to {int(found[-1])}{where}"
        )
    return found


def to_awkward(collection: Collection, offsets: object) -> awkward.Array:
    """The collection's elements as one list of records per event (see the module documentation)."""
    ak = import_awkward()
    import numpy as np

    layout = type(collection)
    if collection.device.type != "cpu":
        raise DeviceError(
            f"to_awkward() shares host memory, but this {layout.NAME} is on {collection.device}: "
            f"copy it with .to('cpu') first"
        )
    size = len(collection)
    index = _check_offsets(layout.NAME, size, offsets)
    views = collection.numpy()
    contents, fields = [], []
    scalars: dict[str, object] = {}
    for spec in layout.MEMBERS:
        view = views[spec.name]
        if not spec.per_element:
            scalars[spec.name] = _scalar_value(spec.dtype, view)
            continue
        if not view.flags.c_contiguous:
            view = np.ascontiguousarray(view)  # coefficient-major: the one copy
        content = ak.contents.NumpyArray(view.reshape(-1))
        for extent in reversed(spec.shape):
            content = ak.contents.RegularArray(content, extent)
        contents.append(content)
        fields.append(spec.name)
    records = ak.contents.RecordArray(contents, fields, length=size)
    lists = ak.contents.ListOffsetArray(ak.index.Index64(index), records)
    return ak.Array(lists, attrs={SCALARS_ATTRIBUTE: scalars})


def from_awkward(
    layout: type[_C],
    array: object,
    *,
    prefix: str | None = None,
    scalars: Mapping[str, object] | None = None,
) -> tuple[_C, NDArray[numpy.int64]]:
    """Every event's elements in one new `layout` collection, and the event offsets (int64,
    events + 1 entries). See the module documentation for the forms of `array` taken."""
    ak = import_awkward()
    import numpy as np
    import torch

    from soagen.runtime.collection import _numpy_dtype

    data = array if isinstance(array, ak.Array) else ak.Array(array)
    found = list(ak.fields(data))
    columns = [spec for spec in layout.MEMBERS if spec.per_element]
    if prefix is None:
        sources = {spec.name: spec.name for spec in columns}
        unknown = [name for name in found if name not in sources]
        if unknown:
            raise ColumnError(
                f"{layout.NAME} has no member for field {', '.join(map(repr, unknown))}: select "
                f"the fields it holds first (array[[...]]), or name them with a prefix (prefix=)"
            )
    else:
        sources = {spec.name: prefix + spec.name for spec in columns}
    missing = [name for name in sources.values() if name not in found]
    if missing:
        raise ColumnError(
            f"the awkward array has no field {', '.join(map(repr, missing))} for {layout.NAME}; "
            f"its fields are {', '.join(found) or 'none'}"
        )
    values: dict[str, object] = {}
    counts: NDArray[typing.Any] | None = None
    counted_from = ""
    for spec in columns:
        name = sources[spec.name]
        field = data[name]
        if field.ndim < 2:
            raise ColumnError(
                f"field {name!r} is not jagged ({field.type}): {layout.NAME}.from_awkward takes, "
                f"per event, a list of values"
            )
        lengths = ak.to_numpy(ak.num(field, axis=1))
        if counts is None:
            counts, counted_from = lengths, name
        elif not np.array_equal(lengths, counts):
            event = int(np.flatnonzero(lengths != counts)[0])
            raise ColumnError(
                f"fields {counted_from!r} and {name!r} hold different numbers of values in event "
                f"{event} ({counts[event]} and {lengths[event]}): they are not one collection"
            )
        expected = _numpy_dtype(spec.dtype)
        described = f"{spec.dtype}{list(spec.shape) if spec.shape else ''}"
        try:
            flat = ak.to_numpy(ak.flatten(field, axis=1), allow_missing=False)
        except ValueError as error:
            raise ColumnError(
                f"field {name!r} cannot be read as {described} values of {layout.NAME}: {error}"
            ) from None
        if flat.dtype != expected or flat.shape[1:] != spec.shape:
            raise ColumnError(
                f"field {name!r} must hold {described} values for {layout.NAME}"
                + (" (as uint16 bit patterns)" if spec.dtype == "bfloat16" else "")
                + f", found {flat.dtype}{list(flat.shape[1:]) if flat.ndim > 1 else ''}"
            )
        if spec.dtype == "bfloat16":
            values[spec.name] = torch.from_numpy(np.array(flat)).view(torch.bfloat16)
        else:
            values[spec.name] = flat
    if counts is None:
        raise ColumnError(f"{layout.NAME} has no columns to read from an awkward array")
    given = dict(scalars if scalars is not None else (data.attrs.get(SCALARS_ATTRIBUTE) or {}))
    for spec in layout.MEMBERS:
        if spec.per_element:
            continue
        if spec.name not in given:
            raise ColumnError(
                f"scalar {spec.name!r} of {layout.NAME} is neither given nor in the array's "
                f"attrs[{SCALARS_ATTRIBUTE!r}]: pass scalars={{{spec.name!r}: value}}"
            )
        values[spec.name] = given.pop(spec.name)
    if given:
        raise ColumnError(f"{layout.NAME} has no scalar {', '.join(map(repr, given))}")
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return layout.from_columns(values), offsets
