"""Running ``sleuth`` commands in-process from tests."""

from __future__ import annotations

import sleuth.cli


def cli_runner(monkeypatch, capsys, modules: list[str]):
    """``run(*argv) -> (rc, out, err)``: ``sleuth ARGS`` with only ``modules``' commands registered."""
    monkeypatch.setattr(sleuth.cli, "COMMAND_MODULES", list(modules))

    def run(*argv):
        rc = sleuth.cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return run
