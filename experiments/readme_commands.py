"""The README's two commands, read from its Quick start: the scripts that run them
(``experiments.fresh_clone``, ``experiments.busy_suite``) cannot drift from what the
README tells a user.

The Quick start's indented lines are its commands: first the install and the demo,
then the test command (``python -m pytest ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Quick start"


@dataclass(frozen=True)
class ReadmeCommands:
    #: a virtual environment, CPU torch, the package and ``autostream demo``, chained
    install_and_demo: str
    #: the whole suite: ``python -m pytest ...``
    test: str


def readme_commands(text: str) -> ReadmeCommands:
    """The commands of a README's Quick start (its indented lines, in order).

    >>> readme_commands("# x\\n## Quick start\\nInstall:\\n\\n    pip install x && x demo\\n\\n"
    ...                 "Test:\\n\\n    python -m pytest -q\\n\\n## Use it\\n\\n    other\\n")
    ReadmeCommands(install_and_demo='pip install x && x demo', test='python -m pytest -q')
    >>> readme_commands("## Quick start\\n\\n    pip install x\\n")
    Traceback (most recent call last):
    ...
    ValueError: the README's Quick start holds 1 indented command(s), not 2 (the install and demo, then `python -m pytest ...`): ['pip install x']
    """
    start = re.search(rf"^{SECTION}\n", text, flags=re.M)
    if start is None:
        raise ValueError(f"the README has no '{SECTION}' section")
    body = text[start.end():]
    end = re.search(r"^## ", body, flags=re.M)
    body = body[:end.start()] if end else body
    commands = [line.strip() for line in body.splitlines() if line.startswith("    ")
                and line.strip()]
    if len(commands) != 2 or not commands[1].startswith("python -m pytest"):
        raise ValueError(f"the README's Quick start holds {len(commands)} indented command(s), "
                         f"not 2 (the install and demo, then `python -m pytest ...`): {commands}")
    return ReadmeCommands(*commands)


def from_readme(path: Path = README) -> ReadmeCommands:
    """This checkout's README's commands.

    >>> from_readme().test.startswith("python -m pytest")
    True
    """
    return readme_commands(path.read_text())
