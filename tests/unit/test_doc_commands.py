"""Every `dlscale ...` command line in README.md, BENCHMARKS.md and docs/ parses with the CLI's
own parser: a flag renamed or removed fails here, not in a user's shell."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from tests.toolkit.doc_blocks import DOCS, code_blocks

from dlscale.cli import build_parser, parse

#: A command line in a code block: the program, then what it is told (not its error output,
#: 'dlscale serve: error: ...').
_COMMAND = re.compile(r"^(?:\$ )?(?:\S*/)?dlscale (?!\S*: )(.*)$")
#: What stands for something the reader fills in or leaves out: not a literal argument.
_PLACEHOLDER = re.compile(r"\.\.\.|\[-|\|")


def _shell_lines(doc: Path) -> list[str]:
    """The lines of the doc's shell blocks, a backslash's continuation joined."""
    return [
        line.strip()
        for language, text in code_blocks(doc)
        if language in ("", "bash", "sh", "console")
        for line in text.replace("\\\n", " ").splitlines()
    ]


def _commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for line in _shell_lines(doc):
            match = _COMMAND.match(line)
            if match is None:
                continue
            # The command alone: not a comment after it, a pipe, a redirect or the next command.
            command = re.split(r"\s(?:#|&&|;|>|2>|&$)", match.group(1))[0]
            if not _PLACEHOLDER.search(command):
                found.append((doc.name, command))
    return found


COMMANDS = _commands()


def test_the_docs_show_a_command_of_every_verb() -> None:
    # So that a fence or pattern this file misreads cannot leave it checking nothing. `demo` is
    # shown as `make demo`, which runs it.
    (verbs,) = [a.choices for a in build_parser()._subparsers._group_actions]
    shown = {shlex.split(command)[0] for _, command in COMMANDS}
    assert set(verbs) - {"demo"} <= shown, set(verbs) - shown


@pytest.mark.parametrize("command", [c for _, c in COMMANDS], ids=[d for d, _ in COMMANDS])
def test_a_documented_command_parses(command: str) -> None:
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parse(shlex.split(command))
    except SystemExit as exc:
        assert exc.code in (0, None), said.getvalue()
