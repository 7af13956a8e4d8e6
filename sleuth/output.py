"""What every command shares about its output: the ``--out`` directory check and the ``--json`` line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sleuth.errors import UserError


def output_dir(path, flag: str = "--out") -> Path:
    """``path`` as an output directory: refused (naming ``flag``) when it exists and is not a directory."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {p} is a file, not a directory; give a directory path (it is created if missing)")
    return p


def print_json_line(obj: dict) -> None:
    """The ``--json`` convention: one JSON object alone on the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(obj, sort_keys=False), flush=True)
