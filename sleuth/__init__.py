"""Sleuth: train language models with reinforcement learning to reason and call a search engine."""

from sleuth.version import __version__  # noqa: F401
