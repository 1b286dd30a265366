"""Prefix caching across requests (issue 43 item 5), as far as the slot design allows.

vLLM's automatic prefix caching hashes a prompt in blocks (each block's hash chains the one
before) and shares the KV blocks of a matching prefix by reference. rossjax's cache is one row
of `max_len` columns per slot, with no block table, so a prefix is reused by *copying* it:

  - the host keeps, per slot, which token sits at which cache column (`Content`: positions
    0..n-1 in order; left padding and an extension's padding are gaps) for every token whose
    KV is written there: the prompt, then every emitted token. A finished sequence's slot keeps
    its content until the slot is given to another request (SlotPool hands the longest-free
    slot out first), so a free slot is a cache entry;
  - a new prompt is hashed in blocks of BLOCK tokens and matched against every slot's chained
    block hashes (and then token by token, so a hash collision cannot reuse the wrong KV): the
    longest whole-block match of at least one block, leaving at least one prompt token to run;
  - the request then takes that slot if it is free (nothing is copied), else any free slot
    into which the matched columns are copied (kv_slots.fork, from a running or held sequence
    too); the rest of the prompt runs as an extension at the next columns (kv_slots.extend, as
    a tool observation does), whose last logits sample the first token, as a prefill's would.

So the reused KV is exactly what a prefill of the same tokens at the same positions wrote
(greedy answers are token-identical; tests/test_prefix_cache.py). New weights
(Engine.set_params) forget every slot's content.
"""

from __future__ import annotations

import dataclasses

BLOCK = 16


def block_hashes(tokens, upto: int | None = None) -> list[int]:
    """Chained hashes of the whole BLOCK-token blocks of tokens[:upto]."""
    n = len(tokens) if upto is None else upto
    out, h = [], 0
    for b in range(n // BLOCK):
        h = hash((h, tuple(tokens[b * BLOCK:(b + 1) * BLOCK])))
        out.append(h)
    return out


@dataclasses.dataclass
class Content:
    """The tokens whose KV a slot holds, position i at column cols[i]."""
    tokens: list
    cols: list
    hashes: list = dataclasses.field(default_factory=list)

    def append(self, tokens, first_col: int):
        self.tokens += list(tokens)
        self.cols += range(first_col, first_col + len(tokens))
        if len(self.tokens) // BLOCK > len(self.hashes):    # a block was completed
            self.hashes = block_hashes(self.tokens)


@dataclasses.dataclass(frozen=True)
class Match:
    slot: int       # the slot holding the prefix
    tokens: int     # prefix tokens reused
    end: int        # the column after the prefix's last token in that slot


class PrefixIndex:
    """Every slot's Content, and the lookup of a prompt's longest cached prefix."""

    def __init__(self):
        self.content: dict[int, Content] = {}
        self.hit_tokens = 0         # prompt tokens taken from the cache
        self.miss_tokens = 0        # prompt tokens prefilled (or run as a suffix)

    def clear(self):
        self.content.clear()

    def set(self, slot: int, tokens, cols):
        self.content[slot] = Content(list(tokens), list(cols), block_hashes(tokens))

    def append(self, slot: int, tokens, first_col: int):
        c = self.content.get(slot)
        if c is not None:
            c.append(tokens, first_col)

    def lookup(self, prompt, exclude=()) -> Match | None:
        """The slot with the longest whole-block prefix of `prompt` (ties: the lowest slot),
        at most len(prompt) - 1 tokens; None below one block."""
        want = block_hashes(prompt, len(prompt) - 1)
        best = None
        for slot, c in sorted(self.content.items()):
            if slot in exclude:
                continue
            b = 0
            for x, y in zip(want, c.hashes):
                if x != y:
                    break
                b += 1
            k = b * BLOCK
            while k and c.tokens[:k] != list(prompt[:k]):   # a hash collision: drop a block
                k -= BLOCK
            if k and (best is None or k > best.tokens):
                best = Match(slot, k, c.cols[k - 1] + 1)
        return best


@dataclasses.dataclass(frozen=True)
class ForkBatch:
    """Prefix-cache hits (a plan entry, rossjax.engine.scheduler): slot m takes the cache
    columns [0, ends[m]) of slot srcs[m] (n_tokens[m] prompt tokens), sampling[m] and
    candidate index candidates[m]; then suffixes[m] (left-padded to `length`) runs as an
    extension with budgets[m]."""
    length: int
    slots: list
    srcs: list
    ends: list
    n_tokens: list
    suffixes: list
    budgets: list
    sampling: list
    candidates: list


def fork_batch(index: PrefixIndex, length: int, group) -> ForkBatch:
    """The plan entry of admitted requests `group` [(request, Match)] whose prompts' rests
    bucket to `length`: their sequences' cache columns and budgets set, their slots' content
    recorded (the source's columns read first: a slot may fork itself)."""
    rows = []
    for r, hit in group:
        suffix, k = r.prompt[hit.tokens:], hit.tokens
        cols = index.content[hit.slot].cols[:k]
        first = hit.end + length - len(suffix)
        for s in r.seqs:
            s.cache_used, s.budget = hit.end + length, s.sampling.max_new_tokens
            s.cached_tokens = k
            rows.append((s, hit, suffix))
        for s in r.seqs:
            index.set(s.slot, r.prompt, cols + list(range(first, first + len(suffix))))
        index.hit_tokens += k
        index.miss_tokens += len(suffix) * len(r.seqs)
    return ForkBatch(length, [s.slot for s, _, _ in rows], [h.slot for _, h, _ in rows],
                     [h.end for _, h, _ in rows], [h.tokens for _, h, _ in rows],
                     [x for _, _, x in rows], [s.budget for s, _, _ in rows],
                     [s.sampling for s, _, _ in rows], [s.candidate for s, _, _ in rows])
