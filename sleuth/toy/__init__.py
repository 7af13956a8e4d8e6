"""The embedded default: the toy world (:mod:`~sleuth.toy.world`), the protocol-shaped transcripts
(:mod:`~sleuth.toy.transcripts`) the tiny base model is pretrained on (:mod:`~sleuth.toy.pretrain`,
settings in :mod:`~sleuth.toy.specs`), and where that model and the world's corpus are cached
(:mod:`~sleuth.toy.cache`). Nothing outside the demo, the ``tiny`` model name and the ``world:*``
data names depends on it."""
