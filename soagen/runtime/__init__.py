"""What generated modules import: metadata classes, the collection and model base classes.

Importing this package imports neither torch nor numpy; they load when a collection first touches memory.
"""

from soagen.runtime.collection import Collection
from soagen.runtime.model import ModelBinding
from soagen.runtime.spec import BindingSpec, BlockSpec, MemberSpec, StridedView
from soagen.runtime.version import check_generated_version

__all__ = [
    "BindingSpec",
    "BlockSpec",
    "Collection",
    "MemberSpec",
    "ModelBinding",
    "StridedView",
    "check_generated_version",
]
