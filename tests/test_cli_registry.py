"""The CLI's commands are listed once (app/cli/commands/__init__.py, issue #26, item 5): each
is a module with NAME, add_parser and run, the parser is built from the list, and nothing
else names the commands (no if-ladder on ``args.command``, no handler dict)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from app.cli import build_parser, commands

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "app" / "cli"


def test_every_command_module_is_listed_once_with_its_parts():
    modules = sorted(p.stem for p in (CLI / "commands").glob("*.py") if p.stem != "__init__")
    listed = [c.__name__.rsplit(".", 1)[1] for c in commands.COMMANDS]
    assert sorted(listed) == modules and len(set(listed)) == len(listed)
    names = [c.NAME for c in commands.COMMANDS]
    assert names == ["chat", "regenerate", "continue", "serve", "conversations", "import", "cache", "bench", "gui", "models"]
    for command in commands.COMMANDS:
        assert len(inspect.signature(command.add_parser).parameters) == 1, command.NAME  # the subparsers
        assert len(inspect.signature(command.run).parameters) == 1, command.NAME
        assert isinstance(command.LOADS_ENGINE, bool) and isinstance(command.STOP_ON_TERM, bool)
        assert commands.by_name(command.NAME) is command
    assert commands.by_name(None) is commands.DEFAULT is commands.gui


def test_the_commands_that_load_llama_cpp_are_the_supervised_ones():
    """The supervisor (a native crash in words) runs exactly these; a SIGTERM keeps the reply
    streamed so far only for the two that write one."""
    assert {c.NAME for c in commands.COMMANDS if c.LOADS_ENGINE} == {"chat", "regenerate", "continue", "bench", "serve"}
    assert {c.NAME for c in commands.COMMANDS if c.STOP_ON_TERM} == {"chat", "regenerate", "continue"}


def test_the_parser_is_built_from_the_registry_in_its_order():
    parser = build_parser()
    assert "{" + ",".join(c.NAME for c in commands.COMMANDS) + "}" in " ".join(parser.format_usage().split())
    assert parser.parse_args(["cache", "stats"]).command == "cache"


def test_no_module_of_the_cli_names_a_command_but_its_own():
    """No ``args.command == "..."`` or ``args.command in (...)`` anywhere in app/cli: what a
    command does is decided by its module."""
    offenders = []
    for file in CLI.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "command" for s in sides):
                    offenders.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
