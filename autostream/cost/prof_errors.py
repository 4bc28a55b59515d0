"""The error a profile reader raises: which file, which row (or event) and which column.

>>> str(ProfileError("kernel_details.csv", "row 3", "Duration(us)", "is 'abc', not a number"))
"profile kernel_details.csv: row 3, column 'Duration(us)': is 'abc', not a number"
"""

from __future__ import annotations


class ProfileError(ValueError):
    """A profile that cannot be read into a cost table; names the file, the row and column."""

    def __init__(self, source: str, row: str, column: str, problem: str) -> None:
        self.source, self.row, self.column, self.problem = source, row, column, problem
        where = ", ".join(p for p in (row, f"column {column!r}" if column else "") if p)
        super().__init__(f"profile {source}: {where + ': ' if where else ''}{problem}")
