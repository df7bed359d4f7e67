"""The one Jinja environment of both generators: templates from `templates/`, an undefined name an
error (StrictUndefined), whitespace as the templates write it."""

from __future__ import annotations

import functools

import jinja2


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("soagen.generator", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
