"""IR to source text: `python` renders a checked schema as Python modules from `templates/`;
`pyformat` keeps that output formatted; `cpp` renders CMSSW C++ headers and says what C++ cannot
hold (SOA5xx). Imports only `soagen.dsl`; torch-free.
"""
