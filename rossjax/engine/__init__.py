"""The rollout engine: continuous batching over a fixed pool of KV-cache slots.

  kv_slots    the device state (slot cache, per-slot columns, positions, logits, sampling knobs)
              and its jitted programs: insert (prefill + copy into slots), extend (append tokens
              to live sequences), decode (a chunk of steps over every slot)
  sampler     per-slot token selection (greedy / temperature / top-k / top-p, seeded streams,
              temperature-1 log-probs of the chosen token)
  scheduler   Engine: requests, slot assignment, admission between decode chunks, hold/extend
              for multi-turn rollouts

rossjax.sample.generate runs on it; `rossjax serve` (rossjax.serve) serves it over HTTP.
"""

from rossjax.engine.scheduler import BUCKETS, Engine, SamplingParams, Update, bucket_length

__all__ = ["BUCKETS", "Engine", "SamplingParams", "Update", "bucket_length"]
