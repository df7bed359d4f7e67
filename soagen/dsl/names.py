"""Names a schema may not use, because the generated module already uses them.

Generated modules keep their own names private (a leading `_`, which schema names cannot start with),
so the only clashes left are Python keywords and the public members every generated layout class
inherits. A test checks that set against the runtime classes so the two cannot drift apart. Binding
names become no attributes (they are keys of `INPUTS`, `OUTPUTS`, `index_bounds=` and `contiguous=`),
so only keywords are refused for them.
"""

from __future__ import annotations

import keyword
import re

# Public attributes of `soagen.runtime.Collection` and of the generated layout classes.
COLLECTION_ATTRIBUTES: frozenset[str] = frozenset(
    {
        "ALIGNMENT",
        "BLOCKS",
        "LAYOUT_KEY",
        "MEMBERS",
        "NAME",
        "SCHEMA",
        "allocate",
        "block",
        "buffer",
        "byte_size",
        "capacity",
        "clone",
        "device",
        "element_range",
        "from_arrow",
        "from_awkward",
        "from_columns",
        "is_pinned",
        "load",
        "member",
        "member_views",
        "nbytes",
        "numpy",
        "offsets",
        "read_only",
        "read_parquet",
        "save",
        "size",
        "slice",
        "to",
        "to_arrow",
        "to_awkward",
        "view",
        "wrap",
        "write_parquet",
    }
)


def is_python_keyword(name: str) -> bool:
    # Soft keywords (`type`, `match`, ...) are valid attribute names, so they stay allowed.
    return keyword.iskeyword(name)


def words(name: str) -> list[str]:
    """`edgeScores`, `EdgeScores`, `edge_scores` and `EDGE_SCORES` all give `edge`, `scores`."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [word.lower() for word in re.split(r"[\s_]+", spaced) if word]


def to_pascal_case(name: str) -> str:
    return "".join(word[:1].upper() + word[1:] for word in words(name)) or name


def to_snake_case(name: str) -> str:
    return "_".join(words(name)) or name
