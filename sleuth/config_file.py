"""Reading and checking configs: YAML files, ``--set dotted.key=value`` overrides, and the check of a
whole :class:`~sleuth.config.Config` against its annotations (pydantic: ``Literal`` choices, bounds as
``Field`` metadata). A wrong key or value is a :class:`ConfigError` whose message names the key."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import TypeAdapter, ValidationError

from sleuth.config import Config
from sleuth.errors import ConfigError  # a wrong key or value; the message names it

_ADAPTER = TypeAdapter(Config)
_EXPECTED = {int: "an integer", float: "a finite number (e.g. 1e-6, 0.001, 3)", bool: "true/false",
             str: "a string", list: "a list"}


def _unwrap(tp: Any) -> tuple[Any, dict[str, Any]]:
    """``(type, bounds)`` of a field annotation: Annotated metadata and ``| None`` peeled off."""
    bounds: dict[str, Any] = {}
    while True:
        if get_origin(tp) is Annotated:
            for meta in tp.__metadata__:
                for b in getattr(meta, "metadata", ()):  # a FieldInfo's [Ge(ge=1), ...]
                    bounds.update({k: getattr(b, k) for k in ("ge", "gt", "le", "lt") if hasattr(b, k)})
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, UnionType):
            tp = next(a for a in get_args(tp) if a is not NoneType)
        else:
            return tp, bounds


def _union_field(names: list[str]) -> tuple[str, str, dict] | None:
    """``(dotted key, the accepted forms, the bounds of its numeric member)`` when ``names`` runs past a
    leaf field into a union's member tag (``train.log_samples`` then ``int``); None otherwise."""
    holder, path = Config, []
    for name in names:
        fields = getattr(holder, "__dataclass_fields__", None)
        if not fields or name not in fields:
            break
        path.append(name)
        annotation = fields[name].type
        holder = _unwrap(annotation)[0]
    if not path or len(path) == len(names) or dataclasses.is_dataclass(holder):
        return None
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    forms, bounds = [], {}
    for member in get_args(annotation) or (annotation,):
        tp, b = _unwrap(member)
        if get_origin(tp) is Literal:
            forms += [repr(v) for v in get_args(tp)]
        else:
            bounds.update(b)
            bound = "".join(f" {op} {b[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                            if k in b)
            forms.append(_EXPECTED.get(get_origin(tp) or tp, "another value") + bound)
    return ".".join(path), " or ".join(forms), bounds


def _message(err: dict, data: dict) -> str:
    """A pydantic error as one line naming the dotted key and the value as given in ``data``."""
    loc, got, kind = err["loc"], data, err["type"]
    try:
        for p in loc:
            got = got[p]
    except (KeyError, IndexError, TypeError):
        got = err["input"]
    names = [p for p in loc if isinstance(p, str)]
    union = _union_field(names)
    if union is not None:  # a value no member of a union field takes (pydantic names the member it tried)
        field_key, forms, b = union
        if kind in ("greater_than", "greater_than_equal") and b:  # a number below the numeric member's bound
            return f"{field_key} must be {'>=' if 'ge' in b else '>'} {b.get('ge', b.get('gt'))}, got {err['input']!r}"
        return f"{field_key}: expected {forms}, got {err['input']!r}"
    key = ".".join(names) + "".join(f"[{p}]" for p in loc if isinstance(p, int))
    holder = Config
    for name in names[:-1]:
        holder = _unwrap(holder.__dataclass_fields__[name].type)[0]
    if kind == "unexpected_keyword_argument" or names[-1] not in holder.__dataclass_fields__:
        return f"unknown config key {key!r}; valid keys here: {sorted(holder.__dataclass_fields__)}"
    tp, b = _unwrap(holder.__dataclass_fields__[names[-1]].type)
    if isinstance(loc[-1], int):
        tp = get_args(tp)[0]  # an item of a list
    low = b.get("ge", b.get("gt"))
    if kind == "literal_error":
        return f"{key}: {got!r} is not one of {list(get_args(tp))}"
    if kind in ("greater_than", "greater_than_equal"):
        return f"{key} must be {'>=' if 'ge' in b else '>'} {low}, got {got!r}"
    if kind in ("less_than", "less_than_equal"):
        interval = f"{'[' if 'ge' in b else '('}{low}, {b.get('le', b.get('lt'))}{']' if 'le' in b else ')'}"
        return f"{key} must be in {interval}, got {got!r}"
    expected = "a mapping" if dataclasses.is_dataclass(tp) else _EXPECTED.get(get_origin(tp) or tp, "another value")
    return f"{key}: expected {expected}, got {got!r}"


# Keys earlier releases wrote into every run's config.yaml that mean nothing now: read and dropped with a
# note, so those runs still resume and evaluate; a --set of one is an unknown key.
RETIRED = {("eval", "greedy"): "evaluation is always greedy",
           ("eval", "limit"): "train.eval_limit limits the evaluations during training, sleuth eval has --limit"}
_noted: set = set()


def _drop_retired(data: dict[str, Any]) -> dict[str, Any]:
    for (section, key), why in RETIRED.items():
        if isinstance(data.get(section), dict) and key in data[section]:
            data = {**data, section: {k: v for k, v in data[section].items() if k != key}}
            if (section, key) not in _noted:
                _noted.add((section, key))
                print(f"note: config key {section}.{key} is retired and ignored ({why})", file=sys.stderr)
    return data


def from_dict(data: dict[str, Any] | None) -> Config:
    """Build a Config from a nested dict, checking every key and value (ConfigError naming the first bad one)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping, got {data!r}")
    data = _drop_retired({k: {} if v is None else v for k, v in data.items()})  # an empty section: defaults
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise ConfigError(_message(e.errors()[0], data)) from None


def validate(cfg: Config) -> Config:
    """Check a config built or changed in code as one read from YAML is; return it unchanged."""
    from_dict(to_dict(cfg))
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``dotted.key=value`` strings (values parsed as YAML scalars/lists)."""
    data = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like dotted.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                raise ConfigError(f"unknown config section {p!r} in override {item!r}")
            node = node[p]
        if parts[-1] not in node:
            raise ConfigError(f"unknown config key {key!r} in override {item!r}; valid keys: {sorted(node)}")
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from e
    return from_dict(data)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (or the defaults when None) and apply overrides."""
    cfg = Config()
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        if not p.is_file():
            raise ConfigError(f"config file {p} is a directory; give a YAML file (see configs/)")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {p} is not UTF-8 text (byte {e.start}); save it as UTF-8 YAML") from None
        cfg = from_dict(data)
    return apply_overrides(cfg, overrides or [])


def config_yaml(cfg: Config) -> str:
    """The YAML text of ``cfg`` (sections and fields in their order)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(config_yaml(cfg))
