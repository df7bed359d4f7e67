"""The element types a schema may use, as one declarative table.

Each row names the type in the .soa language and says how every consumer spells it: its size in bytes,
the torch and NumPy attribute names (strings, so this module imports neither) and the C++ type a
CMSSW producer declares (none for the half-precision types: C++20 has no standard one a CMSSW column
holds).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    itemsize: int
    torch_name: str
    # The NumPy type members are read as: NumPy has no bfloat16, so those are raw uint16 patterns.
    numpy_name: str
    cpp_name: str | None


DTYPES: dict[str, DType] = {
    row.name: row
    for row in (
        DType("bool", 1, "bool", "bool_", "bool"),
        DType("int8", 1, "int8", "int8", "int8_t"),
        DType("int16", 2, "int16", "int16", "int16_t"),
        DType("int32", 4, "int32", "int32", "int32_t"),
        DType("int64", 8, "int64", "int64", "int64_t"),
        DType("uint8", 1, "uint8", "uint8", "uint8_t"),
        DType("uint16", 2, "uint16", "uint16", "uint16_t"),
        DType("uint32", 4, "uint32", "uint32", "uint32_t"),
        DType("uint64", 8, "uint64", "uint64", "uint64_t"),
        DType("float16", 2, "float16", "float16", None),
        DType("bfloat16", 2, "bfloat16", "uint16", None),
        DType("float32", 4, "float32", "float32", "float"),
        DType("float64", 8, "float64", "float64", "double"),
    )
}

# Types whose values can number elements: what an index input (`indexes`) holds.
INTEGER_DTYPES: frozenset[str] = frozenset(
    name for name in DTYPES if name.startswith(("int", "uint"))
)

# Spellings users bring from C++ and NumPy; the checker suggests the .soa name for each.
DTYPE_SPELLINGS: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "int": "int32",
    "long": "int64",
    "short": "int16",
    "char": "int8",
    "int8_t": "int8",
    "int16_t": "int16",
    "int32_t": "int32",
    "int64_t": "int64",
    "uint8_t": "uint8",
    "uint16_t": "uint16",
    "uint32_t": "uint32",
    "uint64_t": "uint64",
    "f4": "float32",
    "f8": "float64",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": "float64",
}
