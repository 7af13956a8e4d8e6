"""Sleuth: train language models with reinforcement learning to reason and call a search engine."""

import sleuth.toy  # noqa: F401  registers the embedded 'tiny' model and toy world (sleuth.named)
from sleuth.version import __version__  # noqa: F401
