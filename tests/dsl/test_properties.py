"""Properties over generated input: the CLI never crashes, and no text can inject code.

`HYPOTHESIS_PROFILE=long` runs many more examples locally; CI runs the bounded default.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soagen.cli import main
from soagen.dsl.loader import load
from soagen.generator.python import generate
from tests.helpers import REPO

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"
EXAMPLES = 2000 if LONG else 120

VALID = (REPO / "schemas" / "gnn.soa").read_text()
TOKENS = re.findall(r"\w+|[^\w\s]|\s+", VALID)
LOCATED_ERROR = re.compile(r"^.+:\d+:\d+: error\[[A-Z0-9_]+\]: .+")


@st.composite
def mutated_schemas(draw: st.DrawFn) -> str:
    """The example schema with tokens deleted, duplicated, swapped for odd ones or inserted."""
    tokens = list(TOKENS)
    for _ in range(draw(st.integers(1, 6))):
        position = draw(st.integers(0, len(tokens) - 1))
        action = draw(st.sampled_from(["delete", "duplicate", "replace", "insert"]))
        odd = draw(
            st.sampled_from(
                [
                    "{",
                    "}",
                    "[",
                    "]",
                    ",",
                    "=",
                    "as",
                    "n",
                    "c",
                    "99999999999999999999999",
                    "-1",
                    "float33",
                    "é",
                    "\u2028",
                    "\x00",
                    '"',
                    "///",
                    "//!",
                    "import",
                    "layout",
                    "model",
                    "\t",
                    "\r",
                    "column",
                    "scalar",
                    "align",
                    "0",
                ]
            )
        )
        if action == "delete":
            del tokens[position]
        elif action == "duplicate":
            tokens.insert(position, tokens[position])
        elif action == "replace":
            tokens[position] = odd
        else:
            tokens.insert(position, odd)
        if not tokens:
            break
    return "".join(tokens)


def run(*args: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = main(list(args))
        except SystemExit as exit:  # argparse's own usage errors
            status = int(exit.code or 0)
    return status, stdout.getvalue(), stderr.getvalue()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_schemas())
def test_the_cli_exits_cleanly_and_locates_every_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "gnn.soa"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        for args in (("show", "--ir", str(path)), (str(path), "-o", str(Path(folder) / "out"))):
            status, stdout, stderr = run(*args)
            assert status in (0, 1), (status, stderr)
            assert "Traceback" not in stdout + stderr
            if status == 1:
                errors = [line for line in stderr.splitlines() if ": error[" in line]
                assert errors and all(LOCATED_ERROR.match(line) for line in errors), stderr


# Doc comment text: anything but a line end (`\n`, or a lone `\r`, which schemas read as one).
DOC_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=["Cs"]),
    max_size=40,
) | st.sampled_from(
    [
        '"""; import os; os.system("touch /tmp/soagen-pwned") #',
        "\\N{BULLET} \\u2028 \\x00 \\",
        "'''",
        '"',
        "\\",
        '\x0c"""\x0b',
        '\u2028"""\u2029',
        "{{ module_doc }} {% raw %}",
    ]
)


def _as_parsed(text: str) -> str:
    """A doc line as the parser keeps it: one leading space dropped, trailing blanks stripped."""
    return (text[1:] if text.startswith(" ") else text).rstrip()


@settings(max_examples=EXAMPLES, deadline=None)
@given(module_doc=DOC_TEXT, layout_doc=DOC_TEXT, member_doc=DOC_TEXT, binding_doc=DOC_TEXT)
def test_doc_comments_cannot_inject_code(
    module_doc: str, layout_doc: str, member_doc: str, binding_doc: str
) -> None:
    source = (
        f"//!{module_doc}\n///{layout_doc}\nlayout Hits {{\n"
        f"    ///{member_doc}\n    column float32 x\n}}\n"
        f"model Fit {{\n    input x = Hits{{x}}\n"
        f"    ///{binding_doc}\n    output y = Hits{{x}}\n}}\n"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hits.soa"
        path.write_text(source, encoding="utf-8")
        result = load(path)
        assert result.schema is not None, result.diagnostics
        (module_source,) = generate(result.schema).values()
    namespace: dict[str, object] = {"__name__": "hits_generated"}
    exec(compile(module_source, "hits_generated.py", "exec"), namespace)  # noqa: S102
    hits, fit = namespace["Hits"], namespace["Fit"]
    assert isinstance(hits, type) and isinstance(fit, type)
    # `////` is a plain comment, not a doc comment (as in Rust).
    layout_doc = "" if layout_doc.startswith("/") else layout_doc
    binding_doc = "" if binding_doc.startswith("/") else binding_doc
    for doc, holder in (
        (layout_doc, hits.__doc__),
        (module_doc, namespace["__doc__"]),
        (binding_doc, fit.__call__.__doc__),
    ):
        expected = _as_parsed(doc).strip("\n")
        if expected.strip():
            assert isinstance(holder, str) and expected.strip() in holder
    assert not Path("/tmp/soagen-pwned").exists()
