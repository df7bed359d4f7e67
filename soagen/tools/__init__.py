"""Schema tooling: `lint` and `breaking` (rules with IDs, categories and purposes), `fmt` (the one
printer of `.soa` text) and `config` (`[tool.soagen.lint]` in pyproject.toml). Imports only
`soagen.dsl`; torch-free, so pre-commit hooks run without torch.
"""
