"""PROPEL probe rewards and their compositions.

A probe reward reads the *frozen reference* model, never the policy: the candidate is rendered to
text, tokenized, run through the reference, pooled as the selected probe's manifest says (layer,
pooling, turn pooling) and scored with the probe (P(in band)). The policy can change what it
writes, not the activations the probe reads for a given text. The reference is the policy's base
or, for cold transfer, another model of any family and width with its own tokenizer
(`reward.probe.reference`); a probe's manifest names the reference it was swept on
(`reference_fingerprint`: path, architecture sha256, weights sha256) and `check_reference`
refuses another. Scores are raw (uncalibrated) for Math and AZR and temperature-calibrated for
SWE, as PROPEL (`calibrated_for`).

Compositions (pure functions of arrays; `valid` is the validity check W, 0/1 or a score):
  probe_only(s)                 s
  hard_gate(s, valid, r_inv)    s where valid else r_inv (default -0.2)
  soft_gate(s, v)               s * v, v in [0, 1]
  wco([s_1..s_k])               min_k s_k  (worst case over an ensemble of probes)
  adversarial(s, s_aux, valid)  min(s, s_aux) on valid tasks, s elsewhere (the auxiliary probe
                                is trained on the original band positives vs the run's false
                                positives + its dominant collapsed family: probes/auxiliary.py)
  combine({name: r}, weights)   sum_i w_i r_i (NaN stays NaN: the row gets advantage 0)
"""

from __future__ import annotations

import functools

import numpy as np

from rossjax.errors import ConfigError

GATES = ("probe_only", "hard_gate", "soft_gate")


def probe_only(s):
    return np.asarray(s, np.float64)


def hard_gate(s, valid, invalid_reward: float = -0.2):
    return np.where(np.asarray(valid) > 0.5, np.asarray(s, np.float64), float(invalid_reward))


def soft_gate(s, v):
    v = np.asarray(v, np.float64)
    if np.any((v < 0) | (v > 1)):
        raise ValueError("soft_gate: validity scores must lie in [0, 1].")
    return np.asarray(s, np.float64) * v


def wco(scores):
    """Worst case over an ensemble: the element-wise minimum of the probes' scores."""
    return np.min(np.stack([np.asarray(s, np.float64) for s in scores]), axis=0)


def adversarial(s, s_aux, valid):
    s = np.asarray(s, np.float64)
    return np.where(np.asarray(valid) > 0.5, np.minimum(s, np.asarray(s_aux, np.float64)), s)


def gate(kind: str, s, valid=None, invalid_reward: float = -0.2):
    if kind == "probe_only":
        return probe_only(s)
    if valid is None:
        raise ConfigError(f"reward gate {kind!r} needs a validity check; configure one.")
    if kind == "hard_gate":
        return hard_gate(s, valid, invalid_reward)
    if kind == "soft_gate":
        return soft_gate(s, valid)
    raise ConfigError(f"reward gate {kind!r} is not one of {', '.join(GATES)}.")


def combine(rewards: dict, weights: dict):
    """sum_i w_i r_i over the named reward functions (each [n])."""
    if not rewards:
        raise ConfigError("combine: no reward functions.")
    missing = [k for k in rewards if k not in weights]
    if missing:
        raise ConfigError(f"combine: reward function {missing[0]!r} has no weight.")
    return sum(float(weights[k]) * np.asarray(r, np.float64) for k, r in rewards.items())


CALIBRATIONS = ("auto", "raw", "temperature")


def calibrated_for(domain: str | None, calibration: str = "auto") -> bool:
    """Whether the RL reward reads temperature-calibrated probe scores. `auto` follows PROPEL:
    raw scores for Math and AZR, calibrated ones for SWE (the probe manifest's `domain`)."""
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"config.reward.probe.calibration {calibration!r} is not one of "
                          f"{', '.join(CALIBRATIONS)}.")
    return calibration == "temperature" or (calibration == "auto" and domain == "swe")


class ProbeScorer:
    """One probe with the manifest it was selected with (layer, pooling, turn pooling) and
    whether its scores are read calibrated (`calibrated_for`)."""

    def __init__(self, probe, manifest: dict, calibration: str = "auto"):
        self.probe, self.manifest = probe, manifest
        self.layer = int(manifest["layer"])
        self.pooling = manifest.get("pooling", "mean")
        self.turn_pooling = manifest.get("turn_pooling", "mean")
        self.turns = bool(manifest.get("turns", False))
        self.calibrated = calibrated_for(manifest.get("domain"), calibration)

    @classmethod
    def load(cls, path: str, calibration: str = "auto"):
        from rossjax.probes.heads import load_probe

        return cls(*load_probe(path), calibration=calibration)

    def score(self, x):
        return self.probe.score(x, calibrated=self.calibrated)


# Compute settings, not the model: a probe trained on float32 activations reads bfloat16 ones.
_NOT_IDENTITY = ("dtype", "param_dtype", "remat_policy", "scan_layers", "attention_impl",
                 "attention_block", "initializer_range")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".npz")


def config_sha256(model_config: dict) -> str:
    """sha256 of a model config's architecture fields (dataclasses.asdict(ModelConfig), as an
    activation store's manifest holds it), compute settings left out."""
    import hashlib
    import json

    d = {k: v for k, v in json.loads(json.dumps(model_config, default=str)).items()
         if k not in _NOT_IDENTITY}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def weights_sha256(spec: str) -> str | None:
    """sha256 over a model folder's weight files (relative path + content, sorted), or None for
    a preset or a folder that is not here. An orbax folder's arrays are all its non-JSON files.
    Cached per process: GRPO checks every probe of an ensemble against the same folder."""
    import hashlib
    import os

    from rossjax.checksums import file_sha256

    if not spec or spec.startswith("preset:") or not os.path.isdir(spec):
        return None
    orbax = os.path.exists(os.path.join(spec, "model_config.json"))
    h, n = hashlib.sha256(), 0
    for root, dirs, files in os.walk(spec):
        dirs.sort()
        for f in sorted(files):
            if (orbax and not f.endswith(".json")) or f.endswith(_WEIGHT_SUFFIXES):
                rel = os.path.relpath(os.path.join(root, f), spec)
                h.update(f"{rel}\0{file_sha256(os.path.join(root, f))}\n".encode())
                n += 1
    return h.hexdigest() if n else None


def reference_fingerprint(spec: str, model_config: dict) -> dict:
    """What a probe manifest records of the model its activations came from (`reference`)."""
    return {"model": spec, "model_type": model_config.get("model_type"),
            "d_model": model_config.get("d_model"), "n_layers": model_config.get("n_layers"),
            "config_sha256": config_sha256(model_config), "weights_sha256": weights_sha256(spec)}


def _describe(r: dict) -> str:
    return (f"{r.get('model') or '?'} ({r.get('model_type')}, d_model {r.get('d_model')}, "
            f"{r.get('n_layers')} layers, config sha256 {str(r.get('config_sha256'))[:12]})")


def check_reference(path: str, manifest: dict, spec: str, model_config: dict, field: str) -> None:
    """Refuse (one sentence) a probe whose manifest names another reference model than the one
    given (`spec`, its ModelConfig as a dict): another architecture, or the same one with other
    weights (hashed only when the architectures agree). Manifests written before probes
    recorded their reference carry no `reference` and pass (the width check still applies)."""
    want = manifest.get("reference")
    if not want:
        return
    given = {"model": spec, "model_type": model_config.get("model_type"),
             "d_model": model_config.get("d_model"), "n_layers": model_config.get("n_layers"),
             "config_sha256": config_sha256(model_config)}
    if want.get("config_sha256") != given["config_sha256"]:
        raise ConfigError(f"{field}: probe {path} was trained on the activations of "
                          f"{_describe(want)}, but the reference model given is {_describe(given)}; "
                          f"give the probe's reference model or a probe swept on this one.")
    have = weights_sha256(spec) if want.get("weights_sha256") else None
    if have and have != want["weights_sha256"]:
        raise ConfigError(f"{field}: probe {path} was trained on the activations of "
                          f"{want.get('model')} (weights sha256 {want['weights_sha256'][:12]}), but "
                          f"the reference model given ({spec}) has the same architecture and other "
                          f"weights (sha256 {have[:12]}); give the probe's reference model or a "
                          f"probe swept on this one.")


class ProbeReward:
    """Scores rendered candidates with the frozen reference and one or more probes.

    `probes`: the selected probe, or several (scored with `wco`); `auxiliary`: an optional
    adversarial auxiliary probe. `render(record) -> (token_ids, turn_spans or None)` turns a
    candidate into what the probe was trained on. `partitioner`: the mesh `ref_params` live on
    (the policy's base in a sharded run); rows then split over its batch axes and attention
    kernels run per shard (the TPU compiler refuses a Pallas kernel it would have to partition).
    """

    def __init__(self, model_cfg, ref_params, probes, render, *, auxiliary=None,
                 batch_tokens: int = 8192, partitioner=None):
        if not probes:
            raise ConfigError("ProbeReward: no probe given (config.reward.probe.path).")
        for p in [*probes, *([auxiliary] if auxiliary is not None else [])]:
            dim = np.shape(p.probe.mean)[-1]
            if p.layer > model_cfg.n_layers or dim != model_cfg.d_model:
                raise ConfigError(f"config.reward.probe: a probe reads layer {p.layer} of width {dim}, "
                                 f"but the reference model has {model_cfg.n_layers} layers of width "
                                 f"{model_cfg.d_model}; give the model it was trained on as "
                                 "config.reward.probe.reference.path.")
        self.model_cfg, self.ref_params, self.render = model_cfg, ref_params, render
        self.probes, self.auxiliary, self.batch_tokens = list(probes), auxiliary, batch_tokens
        self.partitioner = partitioner

    def _score(self, scorer: ProbeScorer, tokens, spans):
        from rossjax.probes.activations import extract

        x = extract(self.model_cfg, self.ref_params, tokens, (scorer.layer,), scorer.pooling,
                    spans if scorer.turns else None, turn_pooling=scorer.turn_pooling,
                    batch_tokens=self.batch_tokens, partitioner=self.partitioner)
        return scorer.score(x[:, 0])

    def __call__(self, records, valid=None) -> dict:
        """{"probe": wco score, "probe_aux": auxiliary score, "probe_reward": after adversarial}."""
        rendered = [self.render(r) for r in records]
        tokens = [t for t, _ in rendered]
        spans = [s for _, s in rendered]
        scores = [self._score(p, tokens, spans) for p in self.probes]
        s = wco(scores)
        out = {"probe": s}
        if self.auxiliary is not None:
            aux = self._score(self.auxiliary, tokens, spans)
            out["probe_aux"] = aux
            s = adversarial(s, aux, np.ones(len(s)) if valid is None else valid)
        out["probe_reward"] = s
        return out


def _synthetic_induction_tasks(n: int, seed: int):
    """Templated function-induction answers, about half valid; (text, task) pairs."""
    import random

    rng = random.Random(seed)
    good = [("def f(x):\n    return x * {a} + {b}", ["1", "2", "3"]),
            ("def f(s):\n    return s[::-1] + '{c}'", ["'ab'", "'xyz'"]),
            ("def f(xs):\n    return sorted(xs)[:{a}]", ["[3, 1, 2]", "[9, 8]"])]
    bad = [("import os\ndef f(x):\n    return x + {a}", ["1", "2"]),
           ("def f(x):\n    return x +", ["1", "2"]),
           ("def f(x):\n    return {a}", ["1", "2"]),
           ("def g(x):\n    return x * {b}", ["1", "2"])]
    out = []
    for i in range(n):
        prog, inputs = rng.choice(good if i % 2 == 0 else bad)
        prog = prog.format(a=rng.randint(2, 9), b=rng.randint(0, 9), c=rng.choice("abc"))
        text = f"```python\n{prog}\n```\n```inputs\n" + "\n".join(inputs) + "\n```"
        out.append((text, {"program": prog, "inputs": inputs}))
    return out


def bootstrap_validity_probe(model_cfg, ref_params, render, *, n: int = 64, layer: int = -1,
                             pooling: str = "mean", seed: int = 0) -> ProbeScorer:
    """A linear probe of the *validity* of templated induction tasks, read from the reference.

    For `:runlocal` smoke runs only, where no probe selected by `rossjax probe-sweep` exists for
    the tiny random model: the labels are real (the induction verifier's `task_valid`), but they
    are validity, not the solver-utility band a PROPEL probe predicts.
    """
    from rossjax.probes import heads
    from rossjax.probes.activations import extract
    from rossjax.verify.induction import task_valid

    pairs = _synthetic_induction_tasks(n, seed)
    y = np.asarray([int(bool(task_valid(t).passed)) for _, t in pairs], np.int32)
    recs = [{"messages": [{"role": "assistant", "content": text}], "token_ids": None}
            for text, _ in pairs]
    tokens = [render(r)[0] for r in recs]
    layer = layer % (model_cfg.n_layers + 1)
    x = extract(model_cfg, ref_params, tokens, (layer,), pooling)[:, 0]
    k = int(0.75 * n)
    probe = heads.train_probe(x[:k], y[:k], x[k:], y[k:],
                              heads.TrainConfig(head="linear", max_epochs=30, seed=seed))
    return ProbeScorer(probe, {"layer": layer, "pooling": pooling, "turns": False,
                               "labels": "bootstrap validity (task_valid)"})
