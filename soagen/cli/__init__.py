"""The `soagen` command line: `main` builds the parser from one module per command.

Each command module (`generate`, `show`, `check`, `explain`, `compile`, `lint`, `fmt`, `breaking`,
`completion`, `triton`, `serve`) holds its `HELP`, `EXAMPLE`, `FORMATS`, `add_arguments` and `run`;
`common` holds what they share. This part may import every other part; nothing outside it imports
it. Commands import torch, the build and serving only when they run.
"""

from soagen.cli.main import main

__all__ = ["main"]
