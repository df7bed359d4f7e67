"""IR to source text: `python` renders a checked schema as Python modules from `templates/`;
`pyformat` keeps that output formatted. Imports only `soagen.dsl`; torch-free.
"""
