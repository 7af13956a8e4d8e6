"""Each choice of ``sleuth.config`` (a ``Literal``) names exactly what its component registers.

``sleuth.config`` imports nothing of sleuth, so a new format, reward kind, estimator, ... is added in two
places: its registry and the Literal of its config field. These tests say which one is missing.
"""

import dataclasses
import typing

import pytest

from sleuth import config

pytestmark = pytest.mark.unit


def _dtypes():
    try:
        from sleuth.models import DTYPES
    except ImportError:  # before the move of sleuth.train.models
        from sleuth.train.models import DTYPES
    return DTYPES


def _formats():
    from sleuth.rollout import formats

    if hasattr(formats, "format_names"):  # protocols and their prompt variants
        return formats.format_names()
    return [*formats.FORMATS, "search_r1_tiny"]  # before the embedded model's prompt variant was registered


def _reward_kinds():
    from sleuth.reward import REWARD_KINDS

    return REWARD_KINDS


def _advantages():
    from sleuth.algo.advantages import ADVANTAGES

    return ADVANTAGES


def _kl_estimators():
    from sleuth.algo.kl import KL_ESTIMATORS

    return KL_ESTIMATORS


def _loss_aggregations():
    from sleuth.algo.aggregate import LOSS_AGGREGATIONS

    return LOSS_AGGREGATIONS


def _retrieval_kinds():
    from sleuth.retrieval.index import KINDS

    return [*KINDS, "url", "memory", "web"]  # the index kinds, a remote server, a corpus held in memory, web search


def _parallel():
    from sleuth.train.distributed import PARALLEL

    return PARALLEL


REGISTRIES = {
    "model.dtype": ("sleuth.models.DTYPES", _dtypes),
    "model.reference_dtype": ("sleuth.models.DTYPES + auto", lambda: [*_dtypes(), "auto"]),
    "rollout.format": ("sleuth.rollout.formats (FORMATS and PROMPT_VARIANTS)", _formats),
    "reward.kind": ("sleuth.reward.REWARD_KINDS", _reward_kinds),
    "reward.answer_metric": ("sleuth.reward.search_r1.ANSWER_METRICS", lambda: __import__(
        "sleuth.reward.search_r1", fromlist=["ANSWER_METRICS"]).ANSWER_METRICS),
    "algo.advantage": ("sleuth.algo.advantages.ADVANTAGES", _advantages),
    "algo.kl_estimator": ("sleuth.algo.kl.KL_ESTIMATORS", _kl_estimators),
    "algo.loss_agg": ("sleuth.algo.aggregate.LOSS_AGGREGATIONS", _loss_aggregations),
    "retrieval.kind": ("sleuth.retrieval.index.KINDS + url, memory, web", _retrieval_kinds),
    "train.parallel": ("sleuth.train.distributed.PARALLEL", _parallel),
    "retrieval.web_provider": ("sleuth.retrieval.web.PROVIDERS", lambda: __import__(
        "sleuth.retrieval.web", fromlist=["PROVIDERS"]).PROVIDERS),
}
# Choices whose users test the names in place (no registry to compare with).
FIXED = {"rollout.backend", "algo.kl_mode", "train.schedule", "train.on_collapse", "sft.source", "train.overlong",
         "rollout.async_worker"}


def _choice_fields() -> dict[str, tuple]:
    """``{"section.field": names}`` for every Literal field of the config."""
    out = {}
    for section in dataclasses.fields(config.Config):
        for name, tp in typing.get_type_hints(section.type).items():
            if typing.get_origin(tp) is typing.Literal:
                out[f"{section.name}.{name}"] = typing.get_args(tp)
    return out


def test_every_choice_field_is_compared_with_a_registry_or_known_to_have_none():
    assert set(_choice_fields()) == set(REGISTRIES) | FIXED


@pytest.mark.parametrize("key", sorted(REGISTRIES))
def test_choices_equal_the_registry(key):
    where, registry = REGISTRIES[key]
    listed, registered = set(_choice_fields()[key]), set(registry())
    assert listed == registered, (
        f"{key}: add {sorted(registered - listed)} to its Literal in sleuth/config.py"
        if registered - listed else f"{key}: {sorted(listed - registered)} are listed in sleuth/config.py but {where} "
        "does not register them (register them, or drop them from the Literal)")


def test_update_dispatches_on_the_advantage_registry():
    """``sleuth.train.update`` refuses a name outside ``ADVANTAGES`` (moved to ``sleuth.algo.advantages``)."""
    from sleuth.algo.advantages import ADVANTAGES
    from sleuth.train import update

    assert update.ADVANTAGES is ADVANTAGES
