"""The tests use the embedded 'tiny' model and the toy world by name, as the sleuth command does: register
them (sleuth.named) the way sleuth.cli does."""

import sleuth.toy  # noqa: F401
