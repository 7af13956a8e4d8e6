"""The embedded default's base model: a tiny tokenizer and causal LM pretrained on the toy world.

``sleuth.toy.cache.load_or_pretrain_tiny(world)`` returns a directory that ``AutoModelForCausalLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load. The default one (world seed 0, default specs) ships in
the package (``sleuth/assets/tiny``, rebuilt by ``python -m sleuth.toy.cache``), so a fresh clone
needs no pretraining. It serves every world: the tokenizer holds the whole name inventory and the
transcripts rename every name and year at random, so the model knows the format and how to copy,
no fact. Any other spec is pretrained once (2.8 minutes at the defaults on an idle 2-core CPU) and
cached under ``$SLEUTH_CACHE`` (default ``~/.cache/sleuth``), keyed by a hash of the world, the
model spec, the pretraining spec, the seed and ``TINY_VERSION``.

Pretraining: a copy warm-up (random-token repeats, which grow the induction heads that copying a
name needs), then the protocol-shaped transcripts of :mod:`sleuth.toy.transcripts` (train
questions only, names renamed at random), with copy rows mixed in. The prompt: ``prompt="tiny"``
(default) uses :data:`TINY_INSTRUCTION`, a short instruction (use :class:`TinySearchR1Format` in
rollouts); ``prompt="search_r1"`` uses the exact Search-R1 instruction (``SearchR1Format``).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path

from sleuth.rollout.formats import TINY_INSTRUCTION, SearchR1Format
from sleuth.toy.names import name_inventory
from sleuth.toy.specs import TINY_VERSION, PretrainSpec, TinyModelSpec, cache_key
from sleuth.toy.transcripts import SEARCH_OPENING, pretraining_docs
from sleuth.toy.world import World
from sleuth.train.sft import bucket_rows, pack_rows, supervised_step
from sleuth.types import Question

TAGS = ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>"]
EOS, PAD = "<|endoftext|>", "<|pad|>"


# ---------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------


def build_tokenizer(texts: list[str], names: list[str] | None = None):
    """A byte-level unigram tokenizer with a vocabulary we choose: every word of ``texts`` seen twice
    or more is one token, and so is every invented name (``names``, default: the whole
    :func:`~sleuth.toy.names.name_inventory`, so the tokenizer serves every world), every year
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
            losses.append(supervised_step(model, opt, batch, tokenizer.pad_token_id, grad_clip=1.0)["loss"])
            if phase == "drill" and len(losses) >= 20 and sum(losses[-20:]) / 20 < spec.drill_stop_loss:
                log and log(f"tiny pretrain copy warm-up done after {step + 1} steps (loss {losses[-1]:.3f})")
                break
            if log and (step % 100 == 0 or step == n_steps - 1):
                log(f"tiny pretrain {phase} step {step + 1}/{n_steps} loss {losses[-1]:.3f} ({time.time() - t0:.0f}s)")
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
