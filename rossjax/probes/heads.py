"""Probe heads and their training: linear, MLP (d -> 512 -> 128 -> 2) and a deeper MLP.

Training follows PROPEL: AdamW (lr 1e-3, weight decay 1e-4), batch 64, up to 50 epochs, early
stopping with patience 7 on validation balanced accuracy, class balance by downsampling the
majority class or by a reweighted loss. Features are standardised with train-split statistics
(stored in the probe), so one learning rate suits every layer's activation scale.

An epoch is one jitted `lax.scan` over minibatches (a python loop of tiny steps would spend its
time dispatching); the step itself comes from `make_train_step` and donates its state.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rossjax.errors import ConfigError, InputError, read_json
from rossjax.probes import metrics

HEADS = {"linear": (), "mlp": (512, 128), "deep_mlp": (1024, 512, 256, 128)}
BALANCE = ("none", "downsample", "reweight")


class ProbeHead(nn.Module):
    """[..., d] -> [..., 2] logits."""

    hidden: tuple[int, ...] = ()
    dropout: float = 0.3

    @nn.compact
    def __call__(self, x, *, train: bool = False):
        for width in self.hidden:
            x = nn.gelu(nn.Dense(width)(x))
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(2)(x)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    head: str = "linear"
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 64
    max_epochs: int = 50
    patience: int = 7
    balance: str = "none"
    dropout: float = 0.3
    seed: int = 0


@dataclasses.dataclass
class Probe:
    """A trained probe: standardisation stats, head params and its calibration temperature."""

    head: str
    params: dict
    mean: np.ndarray
    std: np.ndarray
    temperature: float = 1.0
    dropout: float = 0.3
    history: list = dataclasses.field(default_factory=list)

    def module(self) -> ProbeHead:
        return ProbeHead(HEADS[self.head], self.dropout)

    def logits(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, np.float32) - self.mean) / self.std
        return np.asarray(_apply_fn(self.head, self.dropout)(self.params, jnp.asarray(z)))

    def score(self, x: np.ndarray, calibrated: bool = True) -> np.ndarray:
        """P(in band) per row; this is the probe reward."""
        return metrics.softmax_p1(self.logits(x), self.temperature if calibrated else 1.0)


@functools.lru_cache(maxsize=None)
def _apply_fn(head: str, dropout: float):
    model = ProbeHead(HEADS[head], dropout)
    return jax.jit(lambda params, x: model.apply({"params": params}, x))


def make_train_step(model: ProbeHead, tx: optax.GradientTransformation):
    """One AdamW step on a weighted minibatch: state=(params, opt_state), batch=(x, y, w, rng).

    The loss is sum(w * CE) / sum(w): padding rows have w = 0 and the reweighted balance strategy
    puts n / (2 n_c) on class c, so both reduce to the same weighted mean.
    """

    def step(state, batch):
        params, opt_state = state
        x, y, w, rng = batch

        def loss_fn(p):
            logits = model.apply({"params": p}, x, train=True, rngs={"dropout": rng})
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1e-9)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    return step


@functools.lru_cache(maxsize=None)
def _epoch_fn(head: str, dropout: float, lr: float, weight_decay: float):
    """Jitted epoch (scan over [n_batches, batch] index tables); cached so sweep cells that share
    a head reuse one compilation."""
    model = ProbeHead(HEADS[head], dropout)
    tx = optax.adamw(lr, weight_decay=weight_decay)
    step = make_train_step(model, tx)

    @functools.partial(jax.jit, donate_argnums=(0,))
    def epoch(state, x, y, w, idx, mask, rng):
        rngs = jax.random.split(rng, idx.shape[0])

        def body(st, inp):
            i, m, r = inp
            return step(st, (x[i], y[i], w[i] * m, r))

        state, losses = jax.lax.scan(body, state, (idx, mask, rngs))
        return state, jnp.mean(losses)

    return model, tx, epoch


def _balance(y: np.ndarray, how: str, rng: np.random.Generator):
    """Returns (row indices to train on, per-row loss weights)."""
    if how not in BALANCE:
        raise ConfigError(f"probe training: balance {how!r} is not one of {BALANCE}.")
    idx = np.arange(len(y))
    w = np.ones(len(y), np.float32)
    counts = np.bincount(y, minlength=2)
    if how == "downsample" and counts.min() > 0:
        keep = [rng.choice(np.flatnonzero(y == c), counts.min(), replace=False) for c in (0, 1)]
        idx = np.sort(np.concatenate(keep))
    elif how == "reweight" and counts.min() > 0:
        w = (len(y) / (2.0 * counts[y])).astype(np.float32)
    return idx, w


def train_probe(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                cfg: TrainConfig = TrainConfig(), *, train_ids: Sequence | None = None,
                val_ids: Sequence | None = None, calibrate: bool = True) -> Probe:
    """Train one head; keep the epoch with the best validation balanced accuracy.

    Validation rows steer early stopping and calibration only; `train_ids`/`val_ids` (when given)
    are checked to be disjoint so a leaky split fails loudly instead of inflating the score.
    """
    if cfg.head not in HEADS:
        raise ConfigError(f"probe training: head {cfg.head!r} is not one of {tuple(HEADS)}.")
    if train_ids is not None and val_ids is not None:
        overlap = set(map(str, train_ids)) & set(map(str, val_ids))
        if overlap:  # an explicit raise: `assert` would vanish under python -O
            raise AssertionError(f"probe training would see {len(overlap)} validation rows, e.g. "
                                 f"{next(iter(overlap))!r}")
        if len(train_ids) != len(x_train) or len(val_ids) != len(x_val):
            raise ValueError(f"probe training: {len(train_ids)}/{len(val_ids)} ids for "
                             f"{len(x_train)}/{len(x_val)} train/val rows.")
    x_train = np.asarray(x_train, np.float32)
    y_train = np.asarray(y_train, np.int32)
    if len(x_train) == 0 or len(x_val) == 0:
        raise InputError("probe training: the train and validation splits must both be non-empty.")
    rng = np.random.default_rng(cfg.seed)
    mean = x_train.mean(0)
    std = x_train.std(0) + 1e-6
    xs = (x_train - mean) / std
    xv = jnp.asarray((np.asarray(x_val, np.float32) - mean) / std)
    rows, w = _balance(y_train, cfg.balance, rng)

    model, tx, epoch = _epoch_fn(cfg.head, cfg.dropout, cfg.lr, cfg.weight_decay)
    key = jax.random.PRNGKey(cfg.seed)
    key, init_key = jax.random.split(key)
    params = model.init(init_key, xs[:1])["params"]
    state = (params, tx.init(params))
    apply = _apply_fn(cfg.head, cfg.dropout)
    xs_d, y_d, w_d = jnp.asarray(xs), jnp.asarray(y_train), jnp.asarray(w)

    bs = cfg.batch_size
    n_batches = -(-len(rows) // bs)
    best = (-1.0, None, 0)
    history = []
    for ep in range(cfg.max_epochs):
        perm = rng.permutation(rows)
        pad = n_batches * bs - len(perm)
        mask = np.concatenate([np.ones(len(perm), np.float32), np.zeros(pad, np.float32)])
        # Padding rows repeat the epoch's rows cyclically (masked out): a training set smaller
        # than half a batch needs more than one copy.
        perm = np.resize(perm, n_batches * bs) if pad else perm
        key, ek = jax.random.split(key)
        state, loss = epoch(state, xs_d, y_d, w_d, jnp.asarray(perm.reshape(n_batches, bs)),
                            jnp.asarray(mask.reshape(n_batches, bs)), ek)
        pred = np.asarray(jnp.argmax(apply(state[0], xv), -1))
        bacc = metrics.balanced_accuracy(y_val, pred)
        history.append({"epoch": ep, "loss": float(loss), "val_balanced_accuracy": bacc})
        if bacc > best[0]:
            best = (bacc, jax.tree.map(np.array, state[0]), ep)  # copy: state is donated
        elif ep - best[2] >= cfg.patience:
            break
    probe = Probe(cfg.head, best[1], mean, std, 1.0, cfg.dropout, history)
    if calibrate:
        probe.temperature = metrics.fit_temperature(probe.logits(x_val), np.asarray(y_val))
    return probe


def random_split(n: int, seed: int = 0, fractions=(0.8, 0.1, 0.1)):
    """Indices (train, val, test) of a seeded random 80/10/10 split."""
    perm = np.random.default_rng(seed).permutation(n)
    a = int(round(fractions[0] * n))
    b = a + int(round(fractions[1] * n))
    return np.sort(perm[:a]), np.sort(perm[a:b]), np.sort(perm[b:])


def group_kfold(groups: Sequence, k: int = 5, fold: int = 0, seed: int = 0):
    """Indices (train, val, test) for fold `fold` of a group k-fold: test = the groups of fold
    `fold`, val = those of fold `fold + 1`, train = the rest, so the probe is judged (and stopped
    early) on groups it never saw. Groups go to folds greedily by size (largest first) to balance."""
    groups = [str(g) for g in groups]
    uniq = sorted(set(groups))
    if len(uniq) < 3 or k < 3:
        raise InputError(f"group k-fold: need k >= 3 and at least 3 groups, got k={k}, {len(uniq)} groups.")
    k = min(k, len(uniq))
    sizes = {g: 0 for g in uniq}
    for g in groups:
        sizes[g] += 1
    order = np.random.default_rng(seed).permutation(len(uniq))
    ranked = sorted((uniq[i] for i in order), key=lambda g: -sizes[g])  # stable: seed breaks ties
    load = [0] * k
    fold_of = {}
    for g in ranked:
        f = int(np.argmin(load))
        fold_of[g] = f
        load[f] += sizes[g]
    f_of_row = np.asarray([fold_of[g] for g in groups])
    test = np.flatnonzero(f_of_row == fold % k)
    val = np.flatnonzero(f_of_row == (fold + 1) % k)
    train = np.flatnonzero((f_of_row != fold % k) & (f_of_row != (fold + 1) % k))
    return train, val, test


# ----------------------------------------------------------------------------- files

def save_probe(path: str, probe: Probe, manifest: dict):
    """Orbax checkpoint of {params, mean, std} at `path`, manifest JSON at `path`.json."""
    import orbax.checkpoint as ocp

    path = os.path.abspath(path)
    tree = {"params": probe.params, "mean": np.asarray(probe.mean), "std": np.asarray(probe.std)}
    ocp.PyTreeCheckpointer().save(path, tree, force=True)
    with open(path + ".json", "w") as f:
        json.dump(manifest, f, indent=1, default=float)


def load_probe(path: str) -> tuple[Probe, dict]:
    """The probe saved by `save_probe` / the sweep, and its manifest (layer, pooling, ...)."""
    import orbax.checkpoint as ocp

    path = os.path.abspath(path)
    manifest = read_json(path + ".json", "probe manifest")
    tree = ocp.PyTreeCheckpointer().restore(path)
    probe = Probe(manifest["head"], tree["params"], np.asarray(tree["mean"]),
                        np.asarray(tree["std"]), manifest["temperature"], manifest["dropout"])
    return probe, manifest
