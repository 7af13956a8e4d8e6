"""One root for the errors ``sleuth`` reports: a :class:`~sleuth.errors.SleuthError` (caused by input: a file,
a flag, a config, a service the user runs) is one ``sleuth: error:`` line and exit 2; anything else is a bug
and keeps its traceback. Every error class of the package is one of them, or listed below as a bug's error
(with the reason)."""

import ast
import importlib
from pathlib import Path

import pytest

import sleuth.cli
import sleuth.train.cli
from sleuth.cli import main
from sleuth.errors import ConfigError, DataError, ModelError, RunDirError, ServiceError, SleuthError, UserError

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "sleuth"

# Exception classes of the package that are not input errors, each with why. Everything else must be a SleuthError.
NOT_INPUT_ERRORS = {
    "sleuth.retrieval.client._TooSlow": "control flow inside the client: a request past its deadline is split "
                                        "and retried, never raised to the user",
    "sleuth.train.rollout_ranks.StopRollouts": "control flow on a rollout rank: its training rank said stop, the "
                                               "loop ends, never raised to the user",
}


def test_a_sleuth_error_is_one_line_and_exit_2(tmp_path, capsys):
    """A bad setting fails in the config check, before any model loads: one line, no traceback."""
    code = main(["train", "--out", str(tmp_path / "run"), "--set", "train.total_steps=0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("sleuth: error: ") and "train.total_steps" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_each_kind_and_a_missing_file_print_one_line(monkeypatch, capsys):
    for error in (UserError("u"), ConfigError("c"), DataError("d"), RunDirError("r"), ModelError("m"),
                  ServiceError("s"), FileNotFoundError("no such file: x.jsonl")):
        def fail(args, error=error):
            raise error

        monkeypatch.setattr(sleuth.train.cli, "_run", fail)
        assert main(["train", "--out", "unused"]) == 2
        assert capsys.readouterr().err == f"sleuth: error: {error}\n"


def test_a_retriever_that_stays_down_exits_1(monkeypatch, capsys):
    from sleuth.retrieval.base import RetrieverDownError

    def fail(args):
        raise RetrieverDownError("every search of step 3 failed")

    monkeypatch.setattr(sleuth.train.cli, "_run", fail)
    assert main(["train", "--out", "unused"]) == 1
    assert capsys.readouterr().err == "sleuth: error: every search of step 3 failed\n"


@pytest.mark.parametrize("error", [ValueError("invariant"), RuntimeError("invariant"), KeyError("invariant")])
def test_an_internal_error_keeps_its_traceback(monkeypatch, capsys, error):
    """A plain ValueError inside a command is a bug: it propagates (the interpreter prints its traceback)."""
    def fail(args):
        raise error

    monkeypatch.setattr(sleuth.train.cli, "_run", fail)
    with pytest.raises(type(error), match="invariant"):
        main(["train", "--out", "unused"])
    assert "sleuth: error" not in capsys.readouterr().err


def test_the_kinds_keep_their_builtin_bases():
    """``except ValueError`` (and ``pytest.raises(ValueError)``) still catch the input errors raised as
    ValueErrors before; services' errors stay RuntimeErrors."""
    for kind in (ConfigError, DataError, RunDirError, ModelError):
        assert issubclass(kind, SleuthError) and issubclass(kind, ValueError)
    assert issubclass(ServiceError, SleuthError) and issubclass(ServiceError, RuntimeError)
    assert UserError is SleuthError
    from sleuth.config_file import ConfigError as ConfigFileError

    assert ConfigFileError is ConfigError  # one definition


def _exception_classes() -> dict[str, str]:
    """``{module.Class: module}`` of every class in the package whose bases name an exception: a builtin
    one, a name ending in Error/Exception, or another class found here (to a fixed point)."""
    import builtins

    known = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
             and issubclass(getattr(builtins, n), BaseException)}
    classes = []  # (module, name, base names)
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                classes.append((module, node.name, bases))
    found: dict[str, str] = {}
    while True:
        more = {f"{m}.{n}": m for m, n, bases in classes
                if any(b in known or b.endswith(("Error", "Exception")) for b in bases)
                and f"{m}.{n}" not in found}
        if not more:
            return found
        found.update(more)
        known |= {q.rsplit(".", 1)[1] for q in more}


def test_every_error_class_is_an_input_error_or_listed_as_a_bug():
    found = _exception_classes()
    for name in ("sleuth.retrieval.corpus.CorpusError", "sleuth.rollout.vllm_backend.VLLMUnavailable",
                 "sleuth.retrieval.base.RetrieverDownError", "sleuth.errors.ConfigError"):
        assert name in found  # the finder sees through every way a class names its bases
    unlisted = []
    for qualname, module in sorted(found.items()):
        cls = getattr(importlib.import_module(module), qualname.rsplit(".", 1)[1])
        assert isinstance(cls, type) and issubclass(cls, BaseException), qualname
        if not issubclass(cls, SleuthError) and qualname not in NOT_INPUT_ERRORS:
            unlisted.append(qualname)
    assert unlisted == [], ("make these a SleuthError kind (sleuth.errors), or list them in NOT_INPUT_ERRORS "
                            "with the reason they are bugs' errors")
    assert set(NOT_INPUT_ERRORS) <= set(found), "drop NOT_INPUT_ERRORS entries whose class is gone"


def test_the_modules_errors_sit_under_their_kind():
    from sleuth.data.qa import QADataError
    from sleuth.eval.judge import JudgeError
    from sleuth.models import ModelLoadError
    from sleuth.retrieval.base import IndexFileError, RetrievalError, RetrieverDownError
    from sleuth.retrieval.corpus import CorpusError
    from sleuth.retrieval.faiss_import import FaissImportError
    from sleuth.reward.score_file import BadRowError
    from sleuth.rollout.vllm_backend import VLLMUnavailable
    from sleuth.train.checkpoint import CheckpointError
    from sleuth.train.memory_plan import MemoryPlanError
    from sleuth.view.store import ViewError

    for cls, kind in ((QADataError, DataError), (CorpusError, DataError), (IndexFileError, DataError),
                      (FaissImportError, DataError), (BadRowError, DataError), (MemoryPlanError, ConfigError),
                      (CheckpointError, RunDirError), (ViewError, RunDirError), (ModelLoadError, ModelError),
                      (RetrievalError, ServiceError), (RetrieverDownError, ServiceError), (JudgeError, ServiceError)):
        assert issubclass(cls, kind), (cls, kind)
    assert issubclass(VLLMUnavailable, SleuthError) and issubclass(VLLMUnavailable, ImportError)


def test_sleuth_errors_imports_nothing_from_the_package():
    tree = ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.split(".")[0] == "sleuth"]


def test_main_catches_no_plain_value_error():
    """The command's except clauses name SleuthError (and FileNotFoundError), not ValueError."""
    tree = ast.parse(Path(sleuth.cli.__file__).read_text(encoding="utf-8"))
    caught = {getattr(n, "id", None) for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.type
              for n in ast.walk(h.type)}
    assert "ValueError" not in caught and "Exception" not in caught and "SleuthError" in caught
