"""Generation on the rollout engine (rossjax.engine): one prefill per prompt, then continuous
batching over a pool of KV-cache slots.

    res = generate(cfg, params, [[1, 2, 3], [4, 5]], max_new_tokens=32, temperature=0.7,
                   num_samples=8, seed=0, stop_ids=(eos,))
    res.tokens[i * 8 + j, :res.lengths[i * 8 + j]]   # sample j of prompt i, prompt excluded

`num_samples` copies of a prompt share one prefill (its cache row is copied into that many
slots), which is what GRPO groups need. Rows of sample j of prompt i sit at i * num_samples + j.
Sample j of prompt i draws from fold_in(fold_in(key(seed), i), j)'s stream (the engine's seeds),
so the same seed and inputs give the same samples.

`logprobs` are the log-softmax of logits / temperature (1 when greedy) at the *chosen* token,
before top-k / top-p: the distribution GRPO's trainer scores for its importance ratio.
A stop token is kept in the output and counted in `lengths`; after it a row holds padding (0)
with log-prob 0. A finished row frees its slot at once; with more rows than `_MAX_SLOTS` the
rest wait and take freed slots (continuous batching). Decoding runs in chunks of 16 steps: once
at most half the slots still run, a chunk decodes only those (the engine's compaction), so rows
that stop early stop costing compute.

Sampling with a partitioner (rossjax.sharding.Partitioner: mesh + rules; or a bare mesh) puts
slots over the batch axes and heads over `tensor` (param and cache shardings from
rossjax.models.shardings); results equal the single-device run. Params already in that layout
(as a trainer holds them) are used as they are, not placed again on every call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rossjax import sharding
from rossjax.engine import Engine, SamplingParams, bucket_length  # noqa: F401 (public helper)
from rossjax.engine.sampler import filter_logits as _filter_logits  # noqa: F401 (tests use it)
from rossjax.engine.types import check_token_ids, request_seed
from rossjax.errors import ConfigError, InputError
from rossjax.models import ModelConfig

# More rows than this decode in waves: finished rows hand their slot to a waiting one.
_MAX_SLOTS = 256


@dataclasses.dataclass
class GenerationResult:
    tokens: np.ndarray        # int32 [n_prompts * num_samples, max_new_tokens], 0 after the end
    logprobs: np.ndarray      # float32 [same], log p(chosen token) under logits / T, 0 after the end
    lengths: np.ndarray       # int32 [n_prompts * num_samples], stop token included
    finish_reason: list       # "stop" | "length" per row (rossjax.engine.FinishReason values)

    def sequences(self) -> list[list[int]]:
        return [self.tokens[i, :n].tolist() for i, n in enumerate(self.lengths)]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def generate(cfg: ModelConfig, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, stop_ids=(),
             num_samples: int = 1, seed: int = 0, partitioner=None,
             mesh=None) -> GenerationResult:
    """Sample `num_samples` continuations of each prompt (lists of token ids, any lengths).

    temperature 0 is greedy. Same seed and inputs give the same samples. `partitioner` (or a bare
    `mesh`, with the default rules) runs the sampler sharded; None runs on one device.
    """
    part = sharding.as_partitioner(partitioner if partitioner is not None else mesh)
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        raise InputError("generate: field 'prompts' is empty.")
    for i, p in enumerate(prompts):
        check_token_ids(p, cfg.vocab_size, f"generate: prompts row {i}")
    if max_new_tokens < 1 or num_samples < 1:
        raise ConfigError("generate: fields 'max_new_tokens' and 'num_samples' must be >= 1.")
    SamplingParams(int(max_new_tokens), float(temperature), float(top_p), int(top_k)).check(
        "generate")

    n, g, t = len(prompts), int(num_samples), int(max_new_tokens)
    stop = tuple(int(x) for x in stop_ids)
    mult = 1 if part is None else part.batch_size_multiple()
    slots = _round_up(min(n * g, max(_MAX_SLOTS, g)), mult)
    max_len = bucket_length(max(map(len, prompts))) + t
    eng = Engine(cfg, params, slots=slots, max_len=max_len, partitioner=part,
                 n_stop=max(1, len(stop)), chunk=min(t, 16))
    ids = []
    for i, p in enumerate(prompts):
        # Prompt i's seed: (seed, i) hashed into 64 bits by the engine's fold (see module doc).
        sp = SamplingParams(t, float(temperature), float(top_p), int(top_k), stop,
                            request_seed(seed, i))
        ids += eng.submit(p, sp, n=g)
    eng.run()
    tokens = np.zeros((n * g, t), np.int32)
    logprobs = np.zeros((n * g, t), np.float32)
    lengths = np.zeros((n * g,), np.int32)
    finish = []
    for r, sid in enumerate(ids):
        s = eng.result(sid)
        k = len(s.tokens)
        tokens[r, :k], logprobs[r, :k], lengths[r] = s.tokens, s.logprobs, k
        finish.append(s.finish_reason.value)
    return GenerationResult(tokens, logprobs, lengths, finish)
