import sys

try:
    from soagen.cli import main
except ModuleNotFoundError as error:
    # `python -m soagen` from a checkout whose dependencies were never installed.
    if error.name not in ("lark", "jinja2"):
        raise
    print(
        f"soagen: the package {error.name!r} is missing; install soagen with its dependencies: "
        f"pip install -e . (or pip install soagen)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

raise SystemExit(main())
