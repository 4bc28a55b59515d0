"""Every command's ``--help`` prints its options and exits 0 (argparse formats help lazily:
a stray ``%`` in a help text only fails when a user asks for help)."""

from __future__ import annotations

import pytest

from autostream.cli import main

COMMANDS = ("demo", "plan", "compare", "calibrate")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_every_command_prints_and_exits_0(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: autostream {command}") and "--" in out


def test_top_level_help_names_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS)
