"""The sample the probe sweep measures RVP (reward-variance proxy) on, as PROPEL uses it.

RVP of a candidate probe = Var of the *exact* RL reward over a fixed sample of base-model
(reference-policy) completions: the probe's score, worst-cased with the ensemble the RL reward
uses (`rvp_ensemble`, probes already selected), through the validity gate (`reward`, with each
row's W from `rvp_valid`). The sample is its own set — stores of `rossjax extract` over
base-model generations (`rvp_stores`, one per pooling, same ids), never the test split — and
`rvp_n` rows (default 512) of it, drawn once with `rvp_seed`, so every cell is measured on the
same rows.
"""

from __future__ import annotations

import numpy as np

from rossjax.errors import ConfigError, InputError
from rossjax.probes import reward as reward_lib
from rossjax.probes.store import open_store


def _valid_by_id(path: str) -> dict:
    """id -> W from a JSONL with {"id", "valid"} (a label-corpus labels.jsonl works)."""
    from rossjax.curate.schema import iter_json_lines

    out = {}
    for n, obj, reason, *_ in iter_json_lines(path):
        if reason:
            raise InputError(f"{reason}.")
        if not isinstance(obj, dict) or "id" not in obj or "valid" not in obj:
            raise InputError(f"{path} row {n}: fields 'id' and 'valid' are required.")
        out[obj["id"]] = float(obj["valid"])
    return out


class RvpSample:
    """The RVP rows of every pooling, their validity, and the ensemble's scores on them."""

    def __init__(self, c):
        self.stores = {}
        for p in c.rvp_stores:
            s = open_store(p)
            self.stores[s.manifest["pooling"]] = s
        self.rows, self.valid, self.others, self.source = None, None, [], "none"
        if not self.stores:
            return
        first = next(iter(self.stores.values()))
        ids = first.ids
        for s in self.stores.values():
            if s.ids != ids:
                raise ConfigError(f"configs/probe_sweep.py: field 'rvp_stores': {s.path} holds other "
                                  f"rows than {first.path}.")
        n = min(int(c.rvp_n), len(ids)) if c.rvp_n > 0 else len(ids)
        self.rows = np.sort(np.random.default_rng(c.rvp_seed).choice(len(ids), n, replace=False))
        if c.reward != "probe_only":
            if not c.rvp_valid:
                raise ConfigError(f"configs/probe_sweep.py: field 'rvp_valid' is empty, but the reward "
                                  f"{c.reward!r} gates on validity; give the RVP sample's W "
                                  "(a JSONL of {\"id\", \"valid\"}, e.g. its label-corpus labels.jsonl).")
            w = _valid_by_id(c.rvp_valid)
            missing = [ids[i] for i in self.rows if ids[i] not in w]
            if missing:
                raise InputError(f"{c.rvp_valid}: id {missing[0]!r} of the RVP sample has no 'valid'.")
            self.valid = np.asarray([w[ids[i]] for i in self.rows])
        else:
            self.valid = np.ones(len(self.rows))
        calibrated = reward_lib.calibrated_for(c.get("domain"))  # as the RL reward reads them
        for path in c.rvp_ensemble:
            scorer = reward_lib.ProbeScorer.load(path)
            x = self.x(scorer.pooling, scorer.layer, f"rvp_ensemble probe {path}")
            self.others.append(scorer.probe.score(x, calibrated=calibrated))
        self.source = f"{first.path} ({n} rows)"

    def x(self, pooling: str, layer: int, who: str = "a sweep cell"):
        if pooling not in self.stores:
            raise ConfigError(f"configs/probe_sweep.py: field 'rvp_stores' has no {pooling!r} store "
                              f"for {who}.")
        return self.stores[pooling].read(layer=layer)[self.rows]

    def rvp(self, reward_fn, probe, pooling: str, layer: int) -> float:
        """Var of reward_fn(probe, x, valid, others) over the sample; NaN without a sample."""
        if self.rows is None:
            return float("nan")
        r = np.asarray(reward_fn(probe, self.x(pooling, layer), self.valid, self.others), np.float64)
        return float(np.var(r))
