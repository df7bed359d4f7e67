"""Building models for a schema's bindings: `model` calls a factory and checks the model on example
collections; `compile` exports it and compiles an AOTInductor package; `errors` holds the error
each command reports. Imports `soagen.runtime` and `soagen.dsl`, and torch when it builds.
"""
