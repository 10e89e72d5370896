"""The error every validator raises: all the problems found, not just the first."""

from __future__ import annotations


class ProblemsError(ValueError):
    """Invalid input of some kind; `problems` lists every problem found."""

    what = "input"  # subclasses name what was invalid, e.g. "configuration"

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"invalid {self.what}:\n  " + "\n  ".join(problems))
        self.problems = problems
