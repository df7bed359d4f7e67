"""soagen: Structure-of-Arrays schemas for PyTorch.

The package root imports nothing heavy: the generator and linter run without torch or numpy.
"""

__version__ = "0.3.0"
