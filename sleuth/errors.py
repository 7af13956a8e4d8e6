"""Errors that carry a message for the user: ``sleuth`` prints them as one ``sleuth: error: ...`` line
(exit 2) instead of a traceback. Each names the input and what to do."""

from __future__ import annotations


class UserError(Exception):
    """An error caused by input (a file, a flag, a config): printed without a traceback, exit 2."""
