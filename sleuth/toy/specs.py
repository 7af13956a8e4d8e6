"""The tiny base model's settings: its architecture and how it is pretrained. Both, with the world
and ``TINY_VERSION``, make the cache key (:func:`cache_key`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sleuth.toy.world import World

TINY_VERSION = 5  # bump when synthesis or training changes: part of the cache key


@dataclass(frozen=True)
class TinyModelSpec:
    """A Llama-architecture decoder; ~0.33M parameters at the defaults (with a ~3.1k vocabulary, every
    invented name and year one token). With two-token names (before TINY_VERSION 4) copying a name's
    second token from a passage stayed at 62% and capped EM near 0.44; with one token it is ~100%."""

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2  # two layers copy as well as four (measured: demo EM 0.998 vs 0.91), 40% cheaper
    num_attention_heads: int = 4
    max_position_embeddings: int = 512


@dataclass(frozen=True)
class PretrainSpec:
    """Data synthesis and optimisation settings of the pretraining run."""

    prompt: str = "tiny"  # "tiny" (TINY_INSTRUCTION) or "search_r1" (Search-R1's exact instruction)
    n_transcripts: int = 48000  # 2,000 steps: at 1,500 one of two seeds had not yet learned to copy years
    search_fraction: float = 0.7  # transcripts that search (the rest guess without searching)
    p_search: float = 0.35  # the learned prior to search: the decision token's loss is dropped in
    # some searching transcripts so that P(search) = p_search while most transcripts show the skills
    p_query: float = 0.7  # a search names the right entity
    p_copy: float = 0.95  # the fact is copied from the passages (when it is there)
    topk: int = 1  # passages per search in the observations (the demo retrieves top-1 too)
    seq_len: int = 512
    pack: bool = False  # pack documents into seq_len rows (else one document per row, length-bucketed)
    batch_size: int = 24  # rows per step
    lr: float = 3e-3
    drill_steps: int = 900  # copy warm-up steps at most, before the world documents (0 = none)
    drill_stop_loss: float = 0.3  # the warm-up ends early once its mean loss over 20 steps is below this
    drill_batch_size: int = 32
    drill_max_noise: int = 40  # noise tokens between a copy and its source, at most
    drill_answer_share: float = 0.3  # share of answer rows (see copy_drill_rows)
    drill_world_rows: int = 8  # world rows added to every warm-up batch (no shock when it ends;
    # the early stop then rarely fires: the warm-up runs its drill_steps)
    drill_cue: bool = False  # repeat rows copy after a repeated cue token (see copy_drill_rows)
    drill_mix: int = 8  # copy rows added to every world batch, so the copy heads stay in use
    passage_docs: bool = False  # also train on every passage as a document (world knowledge)
    rename: bool = True  # rename the invented names of every transcript at random (see Renamer)
    train_injected: bool = True  # language-model loss on observations too: the names they repeat
    # ("Doc 1(Title: "X") X was ...") are dense copy practice, which grows the copy heads
    weight_decay: float = 0.05
    warmup_frac: float = 0.05
    threads: int = 2  # 1.75x one thread on an idle 2-core machine; on a busy one, use 1 (2 can be 4x slower)


def cache_key(world: "World", model_spec: TinyModelSpec, spec: PretrainSpec, seed: int) -> str:
    blob = json.dumps({"world": world.fingerprint(), "model": asdict(model_spec), "pretrain": asdict(spec),
                       "seed": seed, "version": TINY_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
