"""Every `kafscale` command and subcommand answers --help with exit 0 and names each of its
arguments, found by walking the real parser (nothing listed by hand); a '%' in a help text
that argparse would read as a format code fails here, not in a user's terminal; and
docs/flags.md is exactly what that walk renders."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys

import pytest

from kafscale.cli import reference
from kafscale.cli.main import build_parser, main
from tests.support.broker import REPO

COMMANDS = {path: parser for path, parser, _ in reference.commands(build_parser())}


def _name(path: tuple[str, ...]) -> str:
    return " ".join(("kafscale", *path))


def test_the_walk_reaches_every_depth():
    # Guards the walk itself: were it to stop descending, every other test here would pass on nothing.
    assert {(), ("broker",), ("topics",), ("topics", "alter-config"), ("groups", "reset-offsets"), ("consume",),
            ("certs", "generate"), ("users", "delete"), ("pipeline", "iceberg")} <= set(COMMANDS)
    assert len(COMMANDS) >= 25


@pytest.mark.parametrize("path", list(COMMANDS), ids=_name)
def test_help_exits_0_and_names_every_argument(path, capsys):
    parser = COMMANDS[path]
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, f"{_name(path)} --help: exit {done.value.code}\n{err}"
    assert out.startswith("usage: " + _name(path))
    for action in reference.options(parser):
        for name in action.option_strings or [action.metavar or action.dest]:
            assert name in out, f"{_name(path)} --help does not name {name}"
    for sub in reference.subcommands(parser):
        assert re.search(rf"(?<![\w-]){re.escape(sub)}(?![\w-])", out), f"{_name(path)} --help does not name its command {sub}"


@pytest.mark.parametrize("path", list(COMMANDS), ids=_name)
def test_help_texts_use_percent_only_as_argparse_means_it(path):
    # argparse formats each help with `%`: a lone '%' crashes --help, and some ('%s') print
    # garbage without crashing, so only '%%' and '%(name)s' may appear.
    for action in reference.options(COMMANDS[path]):
        stray = re.sub(r"%%|%\(\w+\)s", "", action.help or "")
        assert "%" not in stray, f"{_name(path)} {action.option_strings or action.dest}: write '%%' for a percent sign in {action.help!r}"


def test_broker_help_as_a_user_runs_it():
    proc = subprocess.run([sys.executable, "-m", "kafscale", "broker", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "--offsets-topic-num-partitions" in proc.stdout
    assert "hash(group) % its partition count" in proc.stdout


def test_flags_doc_is_what_the_parser_says(monkeypatch):
    for var in [v for v in os.environ if v.startswith("KAFSCALE_")]:
        monkeypatch.delenv(var)  # defaults read from the environment must not leak into the page
    want = reference.markdown(build_parser())
    have = (REPO / reference.FLAGS_DOC).read_text(encoding="utf-8")
    diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), reference.FLAGS_DOC, "parser"))[:60])
    assert have == want, f"{reference.FLAGS_DOC} differs from the parser; regenerate it: python -m kafscale.cli.reference > {reference.FLAGS_DOC}\n{diff}"


def test_security_doc_names_only_real_broker_flags():
    text = (REPO / "docs/security.md").read_text(encoding="utf-8")
    table = text.split("## Flags", 1)[1].split("\n## ", 1)[0]
    named = {flag for row in table.splitlines() if row.startswith("| `--") for flag in re.findall(r"--[a-z0-9-]+", row.split(" | ")[0])}
    real = {opt for action in reference.options(COMMANDS[("broker",)]) for opt in action.option_strings}
    assert named and named <= real, f"docs/security.md names flags the broker does not have: {sorted(named - real)}"
