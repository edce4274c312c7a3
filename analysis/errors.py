"""Errors for unusable input. Each message names the file and what is wrong with it."""
from __future__ import annotations


class InputError(ValueError):
    """Input that cannot be analysed (the CLI exits with code 2)."""

    def __init__(self, path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")
