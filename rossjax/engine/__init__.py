"""The rollout engine: continuous batching over a fixed pool of KV-cache slots.

  types       the public values: SamplingParams, Status, FinishReason, SequenceResult, Update
  slot_pool   SlotPool: the free list of slots (allocate n all-or-none, free)
  scheduler   Scheduler (host only): requests, admission, hold/extend; each step's plan
              (SchedulerOutput) and applying what it emitted (update)
  executor    Executor (device): a plan run as kv_slots' programs over the slot state
  kv_slots    the device state (slot cache, per-slot write columns, positions, logits, sampling
              settings) and its jitted programs: insert (prefill + copy into slots), extend
              (append tokens to live sequences), decode (a chunk of steps over every slot)
  sampler     per-slot token selection (greedy / temperature / top-k / top-p, seeded streams,
              log-probs of the chosen token under logits / T)
  engine      Engine: a scheduler and an executor stepped together (schedule -> execute -> update)

rossjax.sample.generate runs on it; `rossjax serve` (rossjax.serve) serves it over HTTP.
"""

from rossjax.engine.engine import Engine
from rossjax.engine.scheduler import (
    BUCKETS,
    DecodeBatch,
    ExecutionOutput,
    ExtendBatch,
    PrefillBatch,
    Scheduler,
    SchedulerOutput,
    bucket_length,
)
from rossjax.engine.slot_pool import SlotPool
from rossjax.engine.types import FinishReason, SamplingParams, SequenceResult, Status, Update

__all__ = ["BUCKETS", "DecodeBatch", "Engine", "ExecutionOutput", "ExtendBatch", "FinishReason",
           "PrefillBatch", "SamplingParams", "Scheduler", "SchedulerOutput", "SequenceResult",
           "SlotPool", "Status", "Update", "bucket_length"]
