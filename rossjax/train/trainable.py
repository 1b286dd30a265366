"""What a training run trains and what it keeps frozen, shared by SFT (loop.py) and GRPO
(grpo_setup.py): the model, the trained tree, the base, their shardings and the LoRA manifest.

    trainable = Trainable(cfg, partitioner)     # reads cfg.model, cfg.lora, cfg.train.seed
    weights = trainable.load_weights()          # the configured model, placed on the mesh
    state = trainable.init_state(optimizer, shardings, weights)   # a fresh run's train state

Full fine-tuning: the train state's "params" are the model's params (`weights`, donated into
the state). LoRA (`cfg.lora.enabled`): they are adapters (models/lora.py, seeded with
train.seed + 1) on the frozen `weights`, which the steps take as a separate, non-donated `base`;
the reference model is that base with the adapters off, so no second copy is held.
`shardings` / `abstract` describe the trained tree (what a checkpoint restores into),
`param_shardings` the model's params, `base_shardings` the frozen base (None without LoRA).
"""

from __future__ import annotations

import jax

from rossjax.models import loading, lora, shardings as model_shardings
from rossjax.train import checkpoint as ckpt_lib, state as state_lib


def _with_shardings(shapes, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)


class Trainable:
    """The trained tree of one run (full params or LoRA adapters) and how it is laid out."""

    def __init__(self, cfg, partitioner):
        self.cfg, self.part = cfg, partitioner
        self.seed = int(cfg.train.seed)
        self.model_cfg, self.source = loading.abstract_model(cfg.model)
        self.param_shardings = model_shardings.param_shardings(self.model_cfg, partitioner)
        section = cfg.get("lora")
        self.lora = section if section is not None and section.enabled else None
        if self.lora is None:
            self.lora_alpha = None
            self.shardings = self.param_shardings
            self.abstract = model_shardings.sharded_abstract_params(self.model_cfg,
                                                                    self.param_shardings)
            self.base_shardings = None
        else:
            self.lora_alpha = float(self.lora.alpha)
            shapes = jax.eval_shape(self._new_adapters)
            self.shardings = lora.shardings(self.model_cfg, shapes, partitioner)
            self.abstract = _with_shardings(shapes, self.shardings)
            self.base_shardings = self.param_shardings

    def _new_adapters(self):
        return lora.init_lora(self.model_cfg, jax.random.PRNGKey(self.seed + 1), self.lora.rank,
                              self.lora.targets)

    def load_weights(self):
        """The configured model's params (HF folder, orbax export or preset init), placed."""
        return loading.load_params(self.cfg.model, self.model_cfg, self.source, self.part,
                                   seed=self.seed)

    def policy_params(self, trained, base):
        """The params the model runs with: the trained tree, or the base with the adapters
        merged in (W + alpha / rank A @ B)."""
        return trained if self.lora_alpha is None else lora.merge(base, trained, self.lora_alpha)

    def state_shardings(self, optimizer):
        return state_lib.state_shardings(self.shardings, optimizer, self.abstract, self.part)

    def abstract_state(self, optimizer, shardings):
        """The train state's ShapeDtypeStructs with shardings: a checkpoint restore target."""
        return state_lib.abstract_state(shardings, optimizer, self.abstract)

    def init_state(self, optimizer, shardings, weights=None):
        """A fresh train state: new adapters (LoRA), else `weights` (loaded here when None),
        which the state takes over (donated)."""
        if self.lora is not None:
            trained = jax.device_put(self._new_adapters(), self.shardings)
        else:
            trained = self.load_weights() if weights is None else weights
        return state_lib.init_state(trained, optimizer, shardings, seed=self.seed)

    def write_run_files(self, workdir: str):
        """model_config.json, and for LoRA lora.json: checkpoints then hold adapters only, and
        `rossjax export` merges them into the base recorded there (process 0 calls this)."""
        ckpt_lib.write_model_config(workdir, self.model_cfg)
        if self.lora is not None:
            ckpt_lib.write_lora_manifest(
                workdir, rank=self.lora.rank, alpha=self.lora.alpha,
                targets=lora.resolve_targets(self.lora.targets), base_source=self.source,
                base_path=self.cfg.model.path, seed=self.seed)
