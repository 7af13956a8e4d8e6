"""The embedded default's base model: a tiny tokenizer and causal LM pretrained on the toy world.

``tiny_cache.load_or_pretrain_tiny(world)`` returns a directory that ``AutoModelForCausalLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load. The default one (world seed 0, default specs) ships in
the package (``sleuth/assets/tiny``, rebuilt by ``python -m sleuth.train.tiny_cache``), so a fresh clone
needs no pretraining. It serves every world: the tokenizer holds the whole name inventory and the
transcripts rename every name and year at random, so the model knows the format and how to copy,
no fact. Any other spec is pretrained once (2.8 minutes at the defaults on an idle 2-core CPU) and
cached under ``$SLEUTH_CACHE`` (default ``~/.cache/sleuth``), keyed by a hash of the world, the
model spec, the pretraining spec, the seed and ``TINY_VERSION``.

Pretraining: a copy warm-up (random-token repeats, which grow the induction heads that copying a
name needs), then the protocol-shaped transcripts of :mod:`sleuth.train.tiny_data` (train
questions only, names renamed at random), with copy rows mixed in. The prompt: ``prompt="tiny"``
(default) uses :data:`TINY_INSTRUCTION`, a short instruction (use :class:`TinySearchR1Format` in
rollouts); ``prompt="search_r1"`` uses the exact Search-R1 instruction (``SearchR1Format``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sleuth.data.world import World, name_inventory
from sleuth.rollout.formats import SearchR1Format
from sleuth.train.tiny_data import (  # noqa: F401  (re-exported: the tiny model's public names)
    GUESS_OPENING,
    SEARCH_OPENING,
    TINY_INSTRUCTION,
    Bm25Search,
    Renamer,
    TinySearchR1Format,
    make_format,
    pretraining_docs,
    synthesize_transcript,
)
from sleuth.types import Question

TINY_VERSION = 5  # bump when synthesis or training changes: part of the cache key
TAGS = ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>"]
EOS, PAD = "<|endoftext|>", "<|pad|>"


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


# ---------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------


def build_tokenizer(texts: list[str], names: list[str] | None = None):
    """A byte-level unigram tokenizer with a vocabulary we choose: every word of ``texts`` seen twice
    or more is one token, and so is every invented name (``names``, default: the whole
    :func:`~sleuth.data.world.name_inventory`, so the tokenizer serves every world), every year
    1700-2029 and every number 1-40 (after a space; names also without it). Copying a name or a
    year from a passage is then one token. Anything else falls back to bytes. Protocol tags are
    single added (non-special) tokens; ``<|endoftext|>`` is eos (and bos), ``<|pad|>`` pad."""
    from collections import Counter

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if names is None:
        names = [n for group in name_inventory().values() for n in group]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    extra = [TINY_INSTRUCTION, SearchR1Format().user_content(Question("x", "x", ("x",))),
             SearchR1Format().render_invalid(), SearchR1Format().render_error("no results")]
    counts = Counter(w for t in [*texts, *extra] for w, _ in byte_level.pre_tokenize_str(_strip_tags(t)))
    # names also without the space: a passage's title is quoted ('(Title: "Lukon")')
    pieces = [p + name for name in names for p in ("Ġ", "")] + [f"Ġ{n}" for n in [*range(1, 41), *range(1700, 2030)]]
    name_set = set(names)
    words = sorted(w for w, n in counts.items() if n >= 2 and w.lstrip("Ġ") not in name_set and not w.lstrip("Ġ").isdigit())
    vocab = [(EOS, 0.0), (PAD, 0.0)] + [(c, -12.0) for c in sorted(pre_tokenizers.ByteLevel.alphabet())]
    seen = {v for v, _ in vocab}
    for group, score in ((words, -2.0), (pieces, -3.0)):
        vocab += [(w, score) for w in group if w not in seen and not seen.add(w)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=None, byte_fallback=False))
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True), AddedToken(PAD, special=True)])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD)


def _strip_tags(text: str) -> str:
    for t in TAGS:  # a tag is a token of its own: the word after it starts a pre-token ("Doc", not "ĠDoc")
        text = text.replace(t, "\n")
    return text


def build_model(spec: TinyModelSpec, tokenizer, seed: int):
    """A freshly initialised ``LlamaForCausalLM`` with tied embeddings sized to ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads, max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def encode_docs(tokenizer, docs, opening: list[int], train_injected: bool = False) -> list[tuple[list[int], list[int]]]:
    """Tokenise every segment on its own (as the rollout does) into ``(ids, labels)``; labels are
    -100 on injected segments (unless ``train_injected``; the prompt is never trained) and, for ``drop_decision`` documents, on the decision token (the last
    token of ``opening`` at the start of the first trained segment)."""
    flat = [text for segments, _ in docs for text, _ in segments]
    seg_ids = iter(tokenizer(flat, add_special_tokens=False)["input_ids"])
    out = []
    for segments, drop in docs:
        ids, labels, first = [], [], True
        for n, (_, trained) in enumerate(segments):
            x = next(seg_ids)
            y = list(x) if trained or (train_injected and n > 0) else [-100] * len(x)
            if trained and first and drop:
                if x[:len(opening)] != opening:
                    raise ValueError("a searching transcript lacks its opening tokens")  # a synthesis bug
                y[len(opening) - 1] = -100
            first = first and not trained
            ids, labels = ids + x, labels + y
        out.append((ids, labels))
    return out


def bucket_rows(docs: list[tuple[list[int], list[int]]], batch_size: int, eos_id: int,
                rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """One document (+ eos) per row, ordered so that each run of ``batch_size`` rows holds documents
    of similar length (little padding) while the order of the batches is random. A row never shows
    another transcript's names, which would only confuse a model learning to copy them."""
    order = sorted(range(len(docs)), key=lambda i: len(docs[i][0]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return [(docs[i][0] + [eos_id], docs[i][1] + [eos_id]) for batch in batches for i in batch]


def pack_rows(docs: list[tuple[list[int], list[int]]], seq_len: int, eos_id: int) -> list[tuple[list[int], list[int]]]:
    """Whole ``(ids, labels)`` documents, each followed by eos, packed greedily in order into rows of
    at most ``seq_len`` tokens."""
    rows, row_ids, row_labels = [], [], []
    for n, (ids, labels) in enumerate(docs):
        ids, labels = ids + [eos_id], labels + [eos_id]
        if len(ids) > seq_len:
            raise ValueError(f"pretraining document {n} has {len(ids)} tokens > seq_len={seq_len}; raise seq_len")
        if len(row_ids) + len(ids) > seq_len:
            rows.append((row_ids, row_labels))
            row_ids, row_labels = [], []
        row_ids, row_labels = row_ids + ids, row_labels + labels
    if row_ids:
        rows.append((row_ids, row_labels))
    return rows


def _batch_tensors(batch: list[tuple[list[int], list[int]]], pad_id: int):
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids_BT = torch.full((len(batch), width), pad_id)
    labels_BT = torch.full((len(batch), width), -100)
    mask_BT = torch.zeros((len(batch), width), dtype=torch.long)
    for b, (ids, labels) in enumerate(batch):
        input_ids_BT[b, :len(ids)] = torch.tensor(ids)
        labels_BT[b, :len(ids)] = torch.tensor(labels)
        mask_BT[b, :len(ids)] = 1
    return input_ids_BT, labels_BT, mask_BT


def lm_loss(model, input_ids_BT, labels_BT, mask_BT):
    """The causal-LM loss of ``model(..., labels=labels_BT).loss`` (mean over the labelled next
    tokens), with the output layer applied to the labelled positions only: the prompt and the
    drill rows' heads cost no logits (the output layer is ~40% of the tiny model's compute)."""
    import torch.nn.functional as F

    hidden_BTH = model.model(input_ids=input_ids_BT, attention_mask=mask_BT).last_hidden_state
    target_BT = labels_BT[:, 1:]
    keep_BT = target_BT != -100
    logits_NV = model.lm_head(hidden_BTH[:, :-1][keep_BT])
    return F.cross_entropy(logits_NV.float(), target_BT[keep_BT])


def copy_drill_rows(token_ids: list[int], n_rows: int, rng: random.Random, sep_id: int,
                    max_noise: int = 6, answer_tails: list[list[int]] = (), answer_share: float = 0.0,
                    cue: bool = False):
    """Copy warm-up rows of random content tokens, the loss on the copy only. They grow the
    induction (copy) heads in a few hundred cheap steps; on the world's text alone that takes far
    longer than the pretraining budget. Two kinds:

    * repeat rows ``x_1..x_n, noise, sep, x_1..x_n`` (``max_noise`` noise tokens at most: the copy
      distance the heads learn to reach); with ``cue``, ``noise, c, x_1..x_n, noise, c, x_1..x_n``
      instead: the copy starts after a second occurrence of a random cue token ``c``, as a name
      follows "founded by" in a passage and again in the think, so only content (not the
      position in the row) tells where to copy from;
    * with ``answer_tails`` (a share ``answer_share`` of the rows), answer rows
      ``noise, a, b, tail, a, b``: the name said last is repeated after a tail
      (``. </think>\\n<answer>`` or ``<search>``), the fixed-distance copy that writing the answer
      or a follow-up search needs.
    """
    rows = []
    for _ in range(n_rows):
        if answer_tails and rng.random() < answer_share:
            name = [rng.choice(token_ids) for _ in range(2)]
            head = [rng.choice(token_ids) for _ in range(rng.randint(2, max_noise))] + name + rng.choice(answer_tails)
            rows.append((head + name, [-100] * len(head) + name))
            continue
        if cue:
            c, seq = rng.choice(token_ids), [rng.choice(token_ids) for _ in range(rng.randint(2, 6))]
            noise = [[rng.choice(token_ids) for _ in range(rng.randint(0, max_noise))] for _ in range(2)]
            head = noise[0] + [c] + seq + noise[1] + [c]
            rows.append((head + seq, [-100] * len(head) + seq))
            continue
        seq = [rng.choice(token_ids) for _ in range(rng.randint(3, 8))]
        noise = [rng.choice(token_ids) for _ in range(rng.randint(0, max_noise))]
        head = seq + noise + [sep_id]
        rows.append((head + seq, [-100] * len(head) + seq))
    return rows


def pretrain_tiny(world: World, out_dir: str | Path, model_spec: TinyModelSpec = TinyModelSpec(),
                  spec: PretrainSpec = PretrainSpec(), seed: int = 0, log=print, callback=None) -> dict:
    """Build tokenizer + model; train ``spec.drill_steps`` copy warm-up steps, then one epoch of
    causal-LM loss on the packed world documents; save to ``out_dir`` with ``save_pretrained``.
    ``callback(step, steps, model, tokenizer)`` runs after each world step (for benchmarks).
    Returns a summary dict (also written as ``sleuth_tiny.json``)."""
    import torch

    t0 = time.time()
    torch.set_num_threads(spec.threads)
    rng = random.Random(seed)
    docs = pretraining_docs(world, spec, seed)
    # The vocabulary: the passages and a sample of transcripts hold every word the templates use.
    sample = [text for segments, _ in docs[:1000] for text, _ in segments]
    tokenizer = build_tokenizer([p.contents for p in world.passages] + sample)
    model = build_model(model_spec, tokenizer, seed)
    opening = tokenizer(SEARCH_OPENING, add_special_tokens=False)["input_ids"][:3]  # <think> I need
    encoded = encode_docs(tokenizer, docs, opening, train_injected=spec.train_injected)
    if spec.pack:
        rows = pack_rows(encoded, spec.seq_len, tokenizer.eos_token_id)
    else:
        rows = bucket_rows(encoded, spec.batch_size, tokenizer.eos_token_id, rng)
    content = sorted({t for x, _ in encoded for t in x} - set(tokenizer.all_special_ids))
    tails = [tokenizer(f". </think>\n{tag}", add_special_tokens=False)["input_ids"] for tag in ("<answer>", "<search>")]
    drill_args = dict(max_noise=spec.drill_max_noise, answer_tails=tails if spec.drill_answer_share else [],
                      answer_share=spec.drill_answer_share, cue=spec.drill_cue)
    drill = copy_drill_rows(content, spec.drill_steps * spec.drill_batch_size, rng, tokenizer.eos_token_id, **drill_args)
    steps = math.ceil(len(rows) / spec.batch_size)
    mix = copy_drill_rows(content, steps * spec.drill_mix, rng, tokenizer.eos_token_id, **drill_args)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.98))
    warmup = max(1, int(spec.warmup_frac * steps))
    drill_lr = lambda i: min(1.0, (i + 1) / 50)  # noqa: E731
    world_lr = lambda i: min((i + 1) / warmup, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / steps)))  # noqa: E731
    model.train()
    losses, t_train = [], time.time()
    for phase, phase_rows, bs, n_steps, lr_at in (("drill", drill, spec.drill_batch_size, spec.drill_steps, drill_lr),
                                                  ("world", rows, spec.batch_size, steps, world_lr)):
        for step in range(n_steps):
            for group in opt.param_groups:
                group["lr"] = spec.lr * lr_at(step)
            batch = phase_rows[step * bs:(step + 1) * bs]
            if phase == "world":
                batch = batch + mix[step * spec.drill_mix:(step + 1) * spec.drill_mix]
            elif spec.drill_world_rows:  # world rows in the warm-up too: no shock when it ends
                start = step * spec.drill_world_rows % max(1, len(rows) - spec.drill_world_rows)
                batch = batch + rows[start:start + spec.drill_world_rows]
            input_ids_BT, labels_BT, mask_BT = _batch_tensors(batch, tokenizer.pad_token_id)
            loss = lm_loss(model, input_ids_BT, labels_BT, mask_BT)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if phase == "drill" and len(losses) >= 20 and sum(losses[-20:]) / 20 < spec.drill_stop_loss:
                log and log(f"tiny pretrain copy warm-up done after {step + 1} steps (loss {losses[-1]:.3f})")
                break
            if log and (step % 100 == 0 or step == n_steps - 1):
                log(f"tiny pretrain {phase} step {step + 1}/{n_steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
            if callback is not None and phase == "world":
                callback(step, steps, model, tokenizer)
    model.eval()
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary = {"cache_key": cache_key(world, model_spec, spec, seed), "version": TINY_VERSION,
               "world": world.fingerprint(), "seed": seed, "model_spec": asdict(model_spec),
               "pretrain_spec": asdict(spec), "num_parameters": sum(p.numel() for p in model.parameters()),
               "vocab_size": len(tokenizer), "tokens": sum(len(r) for r, _ in rows), "steps": steps,
               "final_loss": sum(losses[-10:]) / len(losses[-10:]), "train_seconds": time.time() - t_train,
               "total_seconds": time.time() - t0}
    (out / "sleuth_tiny.json").write_text(json.dumps(summary, indent=2))
    return summary


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$SLEUTH_CACHE`` or ``~/.cache/sleuth``."""
    return Path(os.environ.get("SLEUTH_CACHE") or Path.home() / ".cache" / "sleuth").expanduser()


def cache_key(world: World, model_spec: TinyModelSpec, spec: PretrainSpec, seed: int) -> str:
    blob = json.dumps({"world": world.fingerprint(), "model": asdict(model_spec), "pretrain": asdict(spec),
                       "seed": seed, "version": TINY_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# A quick greedy sanity loop (the rollout engine is the real one)
# ---------------------------------------------------------------------------------------------


def greedy_episode(model, tokenizer, fmt, retriever, question: Question, *, max_searches: int = 2,
                   max_new_tokens: int = 48, topk: int = 3, prefix: str = "") -> dict:
    """Greedy decode → search → observe → … → answer for one question; turns stop on the single
    tokens ``</search>`` / ``</answer>`` / eos. ``prefix`` is forced at the start of the response
    (e.g. ``"<think> I need to find"`` to measure the searching branch). For checks and reports only."""
    import torch

    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("</search>", "</answer>")] + [tokenizer.eos_token_id]
    ids = tokenizer(fmt.user_content(question) + prefix, add_special_tokens=False)["input_ids"]
    response, queries = prefix, []
    for _ in range(max_searches + 1):
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop_ids,
                                 pad_token_id=tokenizer.pad_token_id)
        new = out[0, len(ids):].tolist()
        turn = tokenizer.decode(new)
        response, ids = response + turn, ids + new
        action = fmt.parse_action(turn)
        if action.kind.value != "search" or len(queries) == max_searches:
            break
        queries.append(action.queries[0])
        obs = fmt.render_observation([(queries[-1], retriever.search(queries[-1:], topk)[0])])
        response, ids = response + obs, ids + tokenizer(obs, add_special_tokens=False)["input_ids"]
    answer = fmt.extract_answer(response)
    correct = answer is not None and answer.strip().lower() in {a.lower() for a in question.golden_answers}
    return {"answer": answer, "correct": correct, "queries": queries, "response": response}

