"""Every command's ``--help`` prints its options and exits 0 (argparse formats help lazily:
a stray ``%`` in a help text only fails when a user asks for help)."""

from __future__ import annotations

import pytest

from autostream.cli import main

COMMANDS = ("demo", "plan", "check", "compare", "calibrate")


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
    assert "exit status: 0 done; 1 " in out and "3 an internal" in out


def test_check_help_states_its_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = capsys.readouterr().out
    for line in ("0  nothing found", "1  the placement has races", "2  bad usage",
                 "3  an internal error"):
        assert f"\n  {line}" in out


def test_an_internal_error_exits_3_not_1(monkeypatch, capsys):
    from autostream.commands import check

    def broken(spec, *args):
        raise TypeError("a bug")

    monkeypatch.setattr(check, "check_spec", broken)
    assert main(["check", "some.module:fn"]) == 3
    err = capsys.readouterr().err
    assert "TypeError: a bug" in err and "internal error" in err


def test_log_lines_name_autostream_once(tmp_path):
    """A warning logged as ``autostream: ...`` (as a library user sees it) is printed by the
    command line as ``WARNING: autostream: ...``, not ``autostream: WARNING: autostream:``."""
    import subprocess
    import sys
    from pathlib import Path

    spec = tmp_path / "warns.py"
    spec.write_text("import logging\nfrom autostream.models.experts import coarse\n\n\n"
                    "def layer():\n"
                    "    logging.getLogger('autostream').warning('autostream: a library line')\n"
                    "    return coarse()\n")
    run = subprocess.run(
        [sys.executable, "-m", "autostream.cli", "check", f"{spec}:layer", "--cost-table",
         "h200", "--time-limit", "0.3"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if "WARNING" in line]
    assert warnings == ["WARNING: autostream: a library line"], warnings
