"""User-facing errors. Every one of them is printed as one line by `cli.main` (exit code 2).

Only errors the user can fix by changing their input derive from `HarnessError`; bugs stay
ordinary exceptions with tracebacks.
"""
from __future__ import annotations


class HarnessError(Exception):
    """A one-line, user-fixable error (bad YAML, unknown name, missing run...). Exit code 2."""

    exit_code = 2


class SpecError(HarnessError):
    """The experiment file is invalid. The message names the file, the field and the valid choices."""


class RegistryError(HarnessError):
    """Unknown op or implementation."""


class StoreError(HarnessError):
    """A run cannot be found, or a run directory is not a valid run."""


class ImportFormatError(HarnessError):
    """A file given to `harness import` is not something we can read."""


def exception_line(exc: BaseException, limit: int = 200) -> str:
    """`Type: first line of the message`, at most `limit` characters: how a failure that is
    not the user's (a kernel, a config) is recorded beside what it failed."""
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0]}" if msg else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
