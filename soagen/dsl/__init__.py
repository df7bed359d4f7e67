"""The `.soa` language: grammar and parser, IR, the check passes, loader, layout math, diagnostics,
the registry of every code soagen reports (`codes`), names and dtypes.

The bottom part: it imports no other part of soagen, and never torch or NumPy. Importing this
package imports nothing; `soagen.dsl.layout` and `soagen.dsl.dtypes` are pure Python that the
runtime shares.
"""
