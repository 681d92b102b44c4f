"""Every `kafscale` command and its flags, read from the parser itself: `commands` walks the
parser into every subcommand (the tests run `--help` on each), and `markdown` renders
docs/flags.md from the same walk, so that page cannot drift from the code. Regenerate it with

    python -m kafscale.cli.reference > docs/flags.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

FLAGS_DOC = "docs/flags.md"


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), summary: str = "") -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """(words after `kafscale`, parser, one-line summary) of the command itself and of every
    subcommand, depth first in the order they were added."""
    yield path, parser, parser.description or summary
    for action in parser._actions:
        if _is_subcommands(parser, action):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share one parser
                    seen.add(id(sub))
                    yield from commands(sub, (*path, name), summaries.get(name, ""))


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions if _is_subcommands(parser, action) for name in action.choices]


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The documented arguments of one command: no --help, no subcommand slot, nothing hidden."""
    return [a for a in parser._actions if _documented(parser, a)]


def _is_subcommands(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    # argparse names its action classes privately; its registry gives them by their public names.
    return isinstance(action, parser._registry_get("action", "parsers"))


def _documented(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    internal = (parser._registry_get("action", "help"), parser._registry_get("action", "parsers"))
    return not isinstance(action, internal) and action.help != argparse.SUPPRESS


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _usage(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or action.dest.upper()
    return ", ".join(f"{opt} {metavar}" for opt in action.option_strings)


def markdown(parser: argparse.ArgumentParser) -> str:
    lines = [
        "# `kafscale` commands and flags",
        "",
        "Generated from the parser by `python -m kafscale.cli.reference > docs/flags.md`; "
        "`tests/test_cli_help.py` fails when this page and the code differ. "
        "Every `kafscale broker` flag is also a `KAFSCALE_<NAME>` environment variable.",
    ]
    shown: dict[tuple, str] = {}
    for path, command, about in commands(parser):
        formatter = command._get_formatter()
        lines += ["", f"## `{' '.join((parser.prog, *path))}`", ""]
        if about:
            lines += [_cell(about), ""]
        subs = subcommands(command)
        if subs:
            lines += ["Commands: " + ", ".join(f"`{s}`" for s in subs) + ".", ""]
        # In --help's order: positionals and options in one table, then each named group;
        # a named group met before (the admin commands' connection and output options) is
        # referred to, not repeated.
        for group in command._action_groups:
            args = [a for a in group._group_actions if _documented(command, a)]
            if not args:
                continue
            if group.title not in ("positional arguments", "options"):
                key = (group.title, tuple(_usage(a) for a in args))
                if key in shown:
                    lines += [f"{group.title.capitalize()}: as under `{shown[key]}`.", ""]
                    continue
                shown[key] = " ".join((parser.prog, *path))
                lines += [f"{group.title.capitalize()}:", ""]
            elif lines[-2].startswith("| `"):  # options go on in the positionals' table
                lines.pop()
            if not lines[-1].startswith("|"):
                lines += ["| argument | meaning |", "|---|---|"]
            lines += [f"| `{_usage(a)}` | {_cell(formatter._expand_help(a) if a.help else '')} |" for a in args]
            lines.append("")
        while lines[-1] == "":
            lines.pop()
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from kafscale.cli.main import build_parser

    sys.stdout.write(markdown(build_parser()))
