"""The hand placement of one's own in ``docs/hand-placements.md``: a SPEC (``autostream.models.
hand_example``) that ``autostream check`` runs, with every wait (no race) and without main's
last wait (the race named, under the modes where it is one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autostream.cli import main as cli_main
from autostream.commands.check import check_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = "autostream.models.hand_example"


@pytest.mark.parametrize("mode", ["cuda", "ge", "acl"])
def test_check_runs_the_docs_placement_and_finds_no_race(mode, capsys):
    result = check_spec(f"{SPEC}:two_branches", mode, time_limit=0.3)
    assert result.ok and result.races == () and result.hand_streams == 2
    assert result.placement.kinds == ("record/wait", "scopes")
    assert result.dependences_checked == 6
    assert cli_main(["check", f"{SPEC}:two_branches", "--mode", mode, "--time-limit", "0.3"]) == 0
    assert (f"hand placement (record/wait, scopes; 2 stream(s)), checked as {mode}: 6 "
            "dependences checked, 0 race(s)") in capsys.readouterr().out


@pytest.mark.parametrize("mode, races", [("cuda", 1), ("acl", 1), ("ge", 0)])
def test_without_the_last_wait_check_names_the_race(mode, races, capsys):
    result = check_spec(f"{SPEC}:forgotten_wait", mode, time_limit=0.3)
    assert len(result.races) == races
    if races:
        [race] = result.races
        assert (race.ops, race.streams) == (("relu", "add"), ("stream_1", "main"))
        assert race.source[0].endswith("(side = self.side(x).relu())")
        assert race.source[1].endswith("(return main + side)")
    code = cli_main(["check", f"{SPEC}:forgotten_wait", "--mode", mode, "--time-limit", "0.3"])
    assert code == (1 if races or not result.ok else 0)
    out = capsys.readouterr().out
    assert f"{races} race(s)" in out and ("race: relu on stream_1" in out) == bool(races)


def test_the_docs_example_is_the_specs_code():
    from autostream.models import hand_example

    page = (ROOT / "docs" / "hand-placements.md").read_text()
    block = re.search(r"## Your own placement\n.*?```python\n(.*?)```", page, flags=re.S)
    assert block is not None
    source = {line.strip() for line in Path(hand_example.__file__).read_text().splitlines()}
    lines = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 10 and all(line in source for line in lines), lines
    assert "autostream check\nautostream.models.hand_example:two_branches --mode ge" in page
