"""The embedded default: the toy world (:mod:`~sleuth.toy.world`), the protocol-shaped transcripts
(:mod:`~sleuth.toy.transcripts`) the tiny base model is pretrained on (:mod:`~sleuth.toy.pretrain`,
settings in :mod:`~sleuth.toy.specs`), and where that model and the world's corpus are cached
(:mod:`~sleuth.toy.cache`). Nothing outside the demo, the ``tiny`` model name and the ``world:*``
data names depends on it."""

from sleuth.named import NamedModel, NamedWorld, register_model, register_world


def _tiny_path():
    from sleuth.toy.cache import default_tiny_model_path  # lazy: building the model needs torch and the trainer

    return default_tiny_model_path()


def _tiny_run_config():
    from sleuth.toy.recipe import demo_config  # lazy: as above

    return demo_config("tiny", steps=1, seed=0, fmt="search_r1_tiny")


def _world_questions(cfg, split: str) -> list:
    from sleuth.toy.corpus import config_world  # lazy: as above

    return list(getattr(config_world(cfg), split))


def _world_corpus(cfg):
    from sleuth.toy.corpus import world_corpus_path  # lazy: as above

    return world_corpus_path(cfg)


register_model("tiny", NamedModel(path=_tiny_path, run_config=_tiny_run_config))
register_world(NamedWorld(questions=_world_questions, corpus_path=_world_corpus))
