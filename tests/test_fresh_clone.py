"""``experiments.fresh_clone``: the README's figures on the whole suite are the script's, read
from the test step of the transcript it writes (no suite is run here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import fresh_clone
from experiments.fresh_clone import BEGIN, END, Step, from_transcript, markdown, write_readme
from experiments.readme_commands import from_readme

ROOT = Path(__file__).resolve().parents[1]
COUNTS = "1390 passed, 63 skipped, 15 warnings in 838.10s (0:13:58)"


def _steps(output: str = f"....s.\n{COUNTS}\n") -> list[Step]:
    return [Step("Clone", "git clone ...", 0, 1.0, "abc123 a commit"),
            Step(fresh_clone.TEST_STEP, ". .venv/bin/activate && python -m pytest -q --slow", 0,
                 842.4, output),
            Step("autostream plan ...", "autostream plan x", 0, 6.0, "1 passed in 0.1s")]


def test_the_suites_figures_come_back_from_the_transcript_the_script_writes():
    note = "the README's commands, the whole suite; AMD EPYC, 2 cores; load average 5.1 at the end"
    run = from_transcript(markdown(_steps(), note))
    assert run.counts == {"passed": 1390, "skipped": 63, "warnings": 15} and run.tests == 1453
    assert run.seconds == 842.0  # the step's wall time as the transcript rounds it
    assert run.sentence().startswith("The whole suite (14 min for 1,453 tests: 1390 passed, "
                                     "63 skipped; in the fresh clone `python -m experiments."
                                     "fresh_clone` made on ")
    assert run.machine == "AMD EPYC, 2 cores; load average 5.1 at the end"
    with pytest.raises(ValueError, match="no pytest count line"):
        from_transcript(markdown(_steps("interrupted\n"), note))
    with pytest.raises(ValueError, match="run `python -m experiments.fresh_clone` first"):
        from_transcript("# A fresh clone\n")


def test_the_readme_sentence_is_written_between_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nThe whole suite (8 min at 1,144 tests)\n{END}\n\n    "
                      "python -m pytest -q\n")
    run = fresh_clone.suite_run(_steps(), "2026-12-06", "AMD EPYC")
    write_readme(run, readme)
    assert readme.read_text() == (f"# x\n\n{BEGIN}\n{run.sentence()}\n{END}\n\n    python -m "
                                  "pytest -q\n")
    readme.write_text("# x\n")
    with pytest.raises(ValueError, match="has no <!-- fresh-clone:begin --> ... <!-- "
                                         "fresh-clone:end --> lines"):
        write_readme(run, readme)


def test_the_readmes_suite_figures_are_the_transcripts():
    text = (ROOT / "README.md").read_text()
    assert BEGIN in text and END in text
    written = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    assert written == from_transcript((ROOT / "docs" / "fresh-clone.md").read_text()).sentence()
    assert "1,144 tests" not in written and "8 min" not in written


def test_the_quick_start_says_how_to_install_through_a_mirror_and_keeps_its_two_commands():
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("## Quick start"):text.index("## Use it")]
    [line] = [ln for ln in quick.splitlines() if "PIP_INDEX_URL" in ln]
    assert "local mirror" in line and "--index-url" in line
    commands = from_readme()
    assert commands.test == "python -m pytest -q --slow"
    assert commands.install_and_demo.endswith("autostream demo")
