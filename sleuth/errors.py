"""The errors ``sleuth`` reports to its user, under one root: :class:`SleuthError`.

A ``SleuthError`` is caused by input (a file, a flag, a config, a service the user runs): the command
prints it as one ``sleuth: error: ...`` line and exits 2, its message naming the input and what to do.
Everything else (a plain ``ValueError``, ``RuntimeError``, ...) is a bug and keeps its traceback.

The kinds below also subclass the built-in error the code raised before (``ValueError``, or
``RuntimeError`` for services), so ``except ValueError`` and ``pytest.raises(ValueError)`` keep
catching them. The modules' own errors (``CorpusError``, ``CheckpointError``, ...) subclass a kind.
This module imports nothing from ``sleuth``: every layer may raise these.
"""

from __future__ import annotations


class SleuthError(Exception):
    """An error caused by input (a file, a flag, a config, a service the user runs): printed as one
    ``sleuth: error:`` line, exit 2. Everything else is a bug and keeps its traceback."""


UserError = SleuthError
"""The root's first name (``raise UserError(...)`` where no kind below fits)."""


class ConfigError(SleuthError, ValueError):
    """A setting, a flag or a config file is wrong, or asks for what this machine lacks (a device);
    the message names the key or flag."""


class DataError(SleuthError, ValueError):
    """Input data that cannot be used: QA files, corpora and the indexes built from them,
    transcripts, score files; the message names the file (and line or field)."""


class RunDirError(SleuthError, ValueError):
    """A run or output directory, or a checkpoint in it, that cannot be used as asked (damaged,
    holding another run, from another setting); the message names it and what to do."""


class ModelError(SleuthError, ValueError):
    """A model the user named that cannot be loaded or used as asked (a hub name without network or
    cache, broken files, a chat template that cannot render the protocol)."""


class ServiceError(SleuthError, RuntimeError):
    """A service the user runs or calls (a retrieval server, a web search API, a judge, a generation
    server) failed or answered something unusable; the message names it."""
