"""Every command's --help works (in process and as a user runs it) and shows a verbatim example whose flags the
command accepts."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from gpuaware.cli import cli
from tests.support import run


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out += _commands(command, (*path, name))
        else:
            out.append((*path, name))
    return out


COMMANDS = _commands(cli)


def _example(help_text: str) -> list[str]:
    lines = help_text.splitlines()
    assert "Example:" in (line.strip() for line in lines), help_text
    at = next(i for i, line in enumerate(lines) if line.strip() == "Example:")
    return shlex.split(lines[at + 1])


def _walk(words: list[str]) -> tuple[tuple[str, ...], set[str]]:
    """The command path an example runs and the flags the root group and the commands on it accept."""
    path: list[str] = []
    command: click.Command = cli
    flags = {opt for p in cli.params for opt in (*p.opts, *p.secondary_opts)}
    for word in words:
        if isinstance(command, click.Group) and word in command.commands:
            path.append(word)
            command = command.commands[word]
            flags |= {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    return tuple(path), flags


def test_the_root_lists_every_command():
    assert set(cli.commands) == {"agent", "bench", "broker", "config", "eval", "scheduler", "simulate", "stream", "up"}
    result = CliRunner().invoke(cli, ["--help"], prog_name="gpuaware")
    listed = result.output.split("Commands:", 1)[1].split()
    assert all(name in listed for name in cli.commands)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "gpuaware")
def test_help_exits_0_and_shows_an_example_of_this_command(path):
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="gpuaware")
    assert result.exit_code == 0, result.output
    assert f"Usage: gpuaware {' '.join(path)}".rstrip() in result.output
    words = _example(result.output)  # \b keeps it on one line, as written
    while "=" in words[0]:  # leading environment assignments
        words.pop(0)
    assert words[0] == "gpuaware", words
    runs, accepted = _walk(words[1:])
    assert runs[:len(path)] == path and runs, words  # a group's example runs one of its commands
    flags = {w.split("=", 1)[0] for w in words if w.startswith("-")}
    assert flags <= accepted, flags - accepted


@pytest.mark.parametrize("command", ["agent", "stream", "scheduler", "simulate", "eval", "bench", "broker", "up",
                                     "config"])
def test_every_subcommand_has_help(command):
    result = run(command, "--help")
    assert result.returncode == 0 and "Usage: gpuaware" in result.stdout
