"""Run monitoring shared by training, GRPO, extraction and probe sweeps: a TensorBoard + JSONL
metrics writer, its reader, and a tqdm progress bar with ETA. No jax import (curate-side code may
use it): "process 0 only" asks jax for the process index only when jax is already loaded.
"""

from __future__ import annotations

import json
import math
import os
import sys


def is_lead_process() -> bool:
    """True on process 0 of a multi-process jax job, and whenever jax is not in use."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


def _scalar(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


class MetricsWriter:
    """Scalars to TensorBoard event files and `metrics.jsonl` in the workdir (process 0 only)."""

    def __init__(self, workdir: str | None, *, enabled: bool | None = None):
        self.enabled = is_lead_process() if enabled is None else enabled
        self.enabled = self.enabled and workdir is not None
        self._tb = None
        self._jsonl = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(logdir=os.path.join(workdir, "tb"))
            self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")

    def write(self, step: int, scalars: dict, prefix: str = "train"):
        if not self.enabled:
            return
        clean = {k: _scalar(v) for k, v in scalars.items()}
        for k, v in clean.items():
            if math.isfinite(v):
                self._tb.add_scalar(f"{prefix}/{k}", v, step)
        self._jsonl.write(json.dumps({"step": int(step), "split": prefix, **{
            k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}) + "\n")
        self._jsonl.flush()

    def close(self):
        if self._tb is not None:
            self._tb.close()
            self._jsonl.close()
            self._tb = self._jsonl = None


def read_metrics(workdir: str, split: str = "train") -> list[dict]:
    """The rows of `metrics.jsonl` for one split (used by tests and reports)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("split") == split]


class Progress:
    """A tqdm bar with ETA on process 0; a no-op elsewhere."""

    def __init__(self, total: int, initial: int = 0, desc: str = "train", enabled: bool | None = None):
        enabled = is_lead_process() if enabled is None else enabled
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True,
                             mininterval=1.0, smoothing=0.1)

    def update(self, n: int = 1, **postfix):
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v)
                                       for k, v in postfix.items()}, refresh=False)
            self._bar.update(n)

    def write(self, msg: str):
        if self._bar is not None:
            self._bar.write(msg)

    def close(self):
        if self._bar is not None:
            self._bar.close()
