"""Cost tables shipped with autostream (JSON, format in ``README.md`` next to this file).

>>> "h200" in available()
True
"""

from __future__ import annotations

from pathlib import Path


def tables_dir() -> Path:
    """The directory holding the shipped ``*.json`` tables."""
    return Path(__file__).resolve().parent


def available() -> list[str]:
    """Names of the shipped tables (file names without ``.json``), sorted."""
    return sorted(p.stem for p in tables_dir().glob("*.json"))


def table_path(name: str) -> Path:
    """Path of the shipped table ``name``; raises ``ValueError`` listing the known names."""
    path = tables_dir() / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no shipped cost table named {name!r}; known: {', '.join(available())} "
                         "(or pass a path to a .json table)")
    return path
