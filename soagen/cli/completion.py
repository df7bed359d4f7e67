"""`soagen completion bash|zsh|fish`: shell completion scripts read off the argparse parser.

Generated, not written by hand, so a new command or option completes as soon as it exists.
Positional schema arguments complete `.soa` files and folders; options with choices complete their
choices; `explain` completes every code and rule ID it knows.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

from soagen.cli.common import EXIT_OK, Output
from soagen.dsl.codes import REGISTRY

HELP = "print a shell completion script"
EXAMPLE = (
    "source <(soagen completion bash)\n"
    "  soagen completion zsh > ~/.zfunc/_soagen\n"
    "  soagen completion fish > ~/.config/fish/completions/soagen.fish"
)
FORMATS: tuple[str, ...] = ("text",)


@dataclass(frozen=True, slots=True)
class Option:
    flags: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...]  # empty: free text, or folders/files per `value_kind`
    value_kind: str  # "choice", "folder", "file", "text" or "" (a flag)


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    # What its positional arguments complete: "schema" (.soa files and folders), "header" (C++
    # headers and folders) or a word list.
    positional: tuple[str, ...] | str | None


def _option(action: argparse.Action) -> Option:
    takes_value = action.nargs != 0
    choices = tuple(str(c) for c in action.choices) if action.choices else ()
    metavar = str(action.metavar or "")
    if not takes_value:
        kind = ""
    elif choices:
        kind = "choice"
    elif metavar == "DIR":
        kind = "folder"
    elif metavar in ("FILE", "PYPROJECT"):
        kind = "file"
    else:
        kind = "text"
    return Option(tuple(action.option_strings), action.help or "", takes_value, choices, kind)


def describe(parser: argparse.ArgumentParser, codes: tuple[str, ...]) -> list[Command]:
    """The commands of the parser with their options and what their arguments are."""
    commands: list[Command] = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            options: list[Option] = []
            positional: tuple[str, ...] | str | None = None
            for sub_action in sub._actions:
                if sub_action.option_strings:
                    options.append(_option(sub_action))
                elif sub_action.dest == "code":
                    positional = codes
                elif sub_action.choices:
                    positional = tuple(str(c) for c in sub_action.choices)
                elif sub_action.metavar == "HEADER":
                    positional = "header"
                else:
                    positional = "schema"
            commands.append(Command(name, helps.get(name, ""), tuple(options), positional))
    return commands


def _words(items: tuple[str, ...]) -> str:
    return " ".join(items)


def bash(commands: list[Command], program: str) -> str:
    names = _words(tuple(c.name for c in commands))
    value_cases: list[str] = []
    option_cases: list[str] = []
    positional_cases: list[str] = []
    for command in commands:
        for option in command.options:
            if not option.takes_value:
                continue
            pattern = "|".join(f"{command.name}:{flag}" for flag in option.flags)
            if option.value_kind == "choice":
                action = f'COMPREPLY=($(compgen -W "{_words(option.choices)}" -- "$cur"))'
            elif option.value_kind == "folder":
                action = 'COMPREPLY=($(compgen -d -- "$cur"))'
            elif option.value_kind == "file":
                action = 'COMPREPLY=($(compgen -f -- "$cur"))'
            else:
                action = "COMPREPLY=()"
            value_cases.append(f"        {pattern}) {action}; return ;;")
        flags = _words(tuple(flag for option in command.options for flag in option.flags))
        option_cases.append(f'        {command.name}) opts="{flags}" ;;')
        if isinstance(command.positional, tuple):
            positional_cases.append(
                f'        {command.name}) COMPREPLY=($(compgen -W "{_words(command.positional)}" '
                '-- "$cur")); return ;;'
            )
        elif command.positional == "header":
            positional_cases.append(
                f"        {command.name}) COMPREPLY=($(compgen -f -X '!*.h*' -- \"$cur\") "
                '$(compgen -d -- "$cur")); return ;;'
            )
    function = f"_{program}_complete"
    return "\n".join(
        [
            f"# bash completion for {program}: source <({program} completion bash)",
            f"{function}() {{",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
            '    local cmd="" opts="" i',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        case "${COMP_WORDS[i]}" in',
            f'            {"|".join(c.name for c in commands)}) cmd="${{COMP_WORDS[i]}}"; break ;;',
            "        esac",
            "    done",
            '    if [[ -z "$cmd" ]]; then',
            '        if [[ "$cur" == -* ]]; then',
            '            COMPREPLY=($(compgen -W "--help --version" -- "$cur"))',
            "        else",
            f'            COMPREPLY=($(compgen -W "{names}" -- "$cur") '
            '$(compgen -f -X \'!*.soa\' -- "$cur") $(compgen -d -- "$cur"))',
            "        fi",
            "        return",
            "    fi",
            '    case "$cmd:$prev" in',
            *value_cases,
            "    esac",
            '    case "$cmd" in',
            *option_cases,
            "    esac",
            '    if [[ "$cur" == -* ]]; then',
            '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
            "        return",
            "    fi",
            '    case "$cmd" in',
            *positional_cases,
            "    esac",
            '    COMPREPLY=($(compgen -f -X \'!*.soa\' -- "$cur") $(compgen -d -- "$cur"))',
            "}",
            f"complete -o filenames -F {function} {program}",
            "",
        ]
    )


def _zsh_text(text: str) -> str:
    for special in ("\\", "[", "]", ":"):
        text = text.replace(special, "\\" + special)
    return text.replace("'", "'\\''")


def zsh(commands: list[Command], program: str) -> str:
    described = " ".join(f"'{c.name}:{_zsh_text(c.help)}'" for c in commands)
    cases: list[str] = []
    for command in commands:
        specs: list[str] = []
        for option in command.options:
            flags = option.flags
            names = f"{{{','.join(flags)}}}" if len(flags) > 1 else flags[0]
            exclusive = f"({' '.join(flags)})" if len(flags) > 1 else ""
            description = f"[{_zsh_text(option.help)}]"
            if option.value_kind == "choice":
                value = f":value:({' '.join(option.choices)})"
            elif option.value_kind == "folder":
                value = ":folder:_files -/"
            elif option.value_kind == "file":
                value = ":file:_files"
            elif option.value_kind == "text":
                value = ":value:"
            else:
                value = ""
            prefix = f"'{exclusive}'" if exclusive else ""
            specs.append(f"{prefix}{names}'{description}{value}'")
        if isinstance(command.positional, tuple):
            specs.append(f"'*:value:({' '.join(command.positional)})'")
        elif command.positional == "schema":
            specs.append("'*:schema:_files -g \"*.soa\"'")
        elif command.positional == "header":
            specs.append("'*:header:_files -g \"*.(h|hh|hpp|hxx)\"'")
        joined = " \\\n                ".join(specs)
        cases.append(
            f"        {command.name})\n            _arguments \\\n                {joined}\n            ;;"
        )
    return "\n".join(
        [
            f"#compdef {program}",
            f"# zsh completion for {program}: source <({program} completion zsh)",
            f"_{program}() {{",
            f"    local -a commands=({described})",
            "    if (( CURRENT == 2 )); then",
            "        _describe 'command' commands",
            "        _files -g '*.soa'",
            "        return",
            "    fi",
            "    local command=$words[2]",
            "    shift words",
            "    (( CURRENT-- ))",
            "    case $command in",
            *cases,
            "    esac",
            "}",
            f"compdef _{program} {program}",
            "",
        ]
    )


def _fish_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def fish(commands: list[Command], program: str) -> str:
    names = " ".join(c.name for c in commands)
    lines = [
        f"# fish completion for {program}: {program} completion fish | source",
        f"complete -c {program} -f",
        f"complete -c {program} -n '__fish_use_subcommand' -k -a '(__fish_complete_suffix .soa)'",
    ]
    for command in commands:
        lines.append(
            f"complete -c {program} -n '__fish_use_subcommand' -a {command.name} "
            f"-d '{_fish_text(command.help)}'"
        )
        seen = f"'__fish_seen_subcommand_from {command.name}'"
        for option in command.options:
            parts = [f"complete -c {program} -n {seen}"]
            for flag in option.flags:
                parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
            if option.value_kind == "choice":
                parts.append(f"-x -a '{' '.join(option.choices)}'")
            elif option.value_kind == "folder":
                parts.append("-x -a '(__fish_complete_directories)'")
            elif option.value_kind in ("file", "text"):
                parts.append("-r")
            parts.append(f"-d '{_fish_text(option.help)}'")
            lines.append(" ".join(parts))
        if isinstance(command.positional, tuple):
            lines.append(f"complete -c {program} -n {seen} -a '{' '.join(command.positional)}'")
        elif command.positional == "schema":
            lines.append(f"complete -c {program} -n {seen} -k -a '(__fish_complete_suffix .soa)'")
        elif command.positional == "header":
            lines.append(f"complete -c {program} -n {seen} -k -a '(__fish_complete_suffix .h)'")
    lines.append(f"# commands: {names}")
    return "\n".join(lines) + "\n"


GENERATORS: dict[str, Callable[[list[Command], str], str]] = {
    "bash": bash,
    "zsh": zsh,
    "fish": fish,
}


def script(shell: str, parser: argparse.ArgumentParser, codes: tuple[str, ...]) -> str:
    return GENERATORS[shell](describe(parser, codes), parser.prog)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=tuple(GENERATORS), help="the shell")


def run(args: argparse.Namespace, output: Output) -> int:
    # The whole parser, set as a default by `soagen.cli.main`: the script covers every command.
    sys.stdout.write(script(args.shell, args.root_parser, tuple(REGISTRY)))
    return EXIT_OK
