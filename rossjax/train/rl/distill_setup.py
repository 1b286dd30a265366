"""What an on-policy distillation run holds beyond GRPO's (grpo_setup.Run): the checked
`config.distill` section, the frozen teachers (each its own model, loaded once, never trained)
and the distillation step functions (distill_step.DistillFns) in place of GRPO's.

config.distill:
  teachers     name -> model spec: a Hugging Face folder, a `rossjax export --format orbax`
               folder, or `preset:NAME` (random init, seeded; `:runlocal`'s tiny teachers)
  routes       row field value -> teacher name (multi-teacher: a teacher per task domain)
  route_field  the task field routed on ("domain")
  default      the teacher of rows whose field has no route ("" refuses such a row)
  loss         a DISTILL_REGISTRY name: reverse_kl_sampled | reverse_kl_full | module:function
  tokenizers   name -> tokenizer spec of a teacher whose folder holds none ("" : the folder's;
               a preset teacher uses the run's tokenizer)
A teacher's tokenizer must match the student's (distill.check_teacher; the architecture family
may differ); this is checked before any model loads.
"""

from __future__ import annotations

import json
import os

import jax

from rossjax.errors import ConfigError
from rossjax.models import loading, shardings as model_shardings
from rossjax.train import optim
from rossjax.train.rl import distill, distill_step, grpo_setup, grpo_step

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tekken.json")


def teacher_names(cfg) -> list[str]:
    return list(cfg.distill.teachers.keys())


def teacher_tokenizer(cfg, name: str):
    """The tokenizer spec of teacher `name` (module doc), or ConfigError when none is known."""
    d, spec = cfg.distill, str(cfg.distill.teachers[name])
    given = (d.get("tokenizers") or {}).get(name, "")
    if given:
        return given
    if spec.startswith("preset:"):
        return cfg.tokenizer
    if any(os.path.exists(os.path.join(spec, f)) for f in _TOKENIZER_FILES):
        return spec
    raise ConfigError(f"config.distill.teachers.{name} ({spec}) holds no tokenizer files; name "
                      f"its tokenizer with --config.distill.tokenizers.{name}=SPEC.")


def check_config(cfg) -> str:
    """One-sentence ConfigErrors for the distill section (and the GRPO settings it cannot use),
    then every teacher's tokenizer against the student's. Returns the shared tokenizer
    fingerprint. No model is loaded."""
    d, g = cfg.distill, cfg.grpo
    names = teacher_names(cfg)
    if not names:
        raise ConfigError("config.distill.teachers is empty; give name -> teacher model folder.")
    for n in names:
        if not str(d.teachers[n]):
            raise ConfigError(f"config.distill.teachers.{n} is empty; give the teacher's Hugging "
                              f"Face folder (or preset:NAME).")
        loading.section_from_spec(str(d.teachers[n]), where=f"config.distill.teachers.{n}")
    routes = dict(d.routes)
    bad = {k: v for k, v in routes.items() if v not in names}
    if bad:
        k = next(iter(bad))
        raise ConfigError(f"config.distill.routes.{k} names teacher {bad[k]!r}, which is not in "
                          f"config.distill.teachers ({', '.join(names)}).")
    if d.default and d.default not in names:
        raise ConfigError(f"config.distill.default {d.default!r} is not in "
                          f"config.distill.teachers ({', '.join(names)}).")
    if not routes and not d.default:
        raise ConfigError("config.distill has neither routes nor a default teacher; name one.")
    distill.DISTILL_REGISTRY.get(d.loss)
    rows = g.contexts * g.group_size
    if g.num_iterations != 1 or (g.minibatch or rows // max(1, g.minibatches)) != rows:
        raise ConfigError("config.grpo.num_iterations and minibatches must be 1 for distill: the "
                          "reverse-KL estimate is on-policy, one update per sampled batch.")
    for field in ("async_sampling", "dynamic_sampling", "overlong_filter"):
        if g.get(field):
            raise ConfigError(f"config.grpo.{field} is a GRPO setting distill does not use; set "
                              f"it False.")
    if g.beta or g.overlong_buffer or g.is_mode != "none":
        raise ConfigError("config.grpo.beta, overlong_buffer and is_mode are GRPO settings "
                          "distill does not use; leave them 0 / 'none'.")
    fp = None
    for n in names:
        fp = distill.check_teacher(f"config.tokenizer {cfg.tokenizer}", cfg.tokenizer,
                                   f"{n} ({d.teachers[n]})", teacher_tokenizer(cfg, n))
    return fp


class DistillRun(grpo_setup.Run):
    """grpo_setup.Run with the teachers and the distillation step functions. The reward
    machinery stays: rewards are measured (metrics, the history's verdicts), not trained on."""

    def _setup_updates(self, step_cache):
        cfg, g, d = self.cfg, self.cfg.grpo, self.cfg.distill
        rows = g.contexts * g.group_size
        if rows % g.micro_batches:
            raise ConfigError(f"config.grpo.micro_batches {g.micro_batches} does not divide the "
                              f"{rows} rows of a step (contexts x group_size).")
        self.minibatch, self.updates_per_step = rows, 1
        self.optimizer, schedule = optim.make_optimizer(cfg.optim, g.steps)
        t = self.trainable
        self.state_shardings = t.state_shardings(self.optimizer)
        self.temperature = grpo_step.sampling_temperature(g.temperature)
        self._load_teachers()
        # The settings the compiled steps depend on; the run's length only through a schedule
        # that changes with it (a constant rate with a fixed warm-up does not: a continued run,
        # grpo.steps raised, reuses the programs in this process).
        o = cfg.optim
        steady = o.schedule == "constant" and 0 <= o.warmup_steps <= g.steps
        g_key = {k: v for k, v in g.to_dict().items() if k != "stop_after"
                 and not (steady and k == "steps")}
        key = ("distill", self.model_cfg, o.to_json(), json.dumps(g_key, sort_keys=True,
               default=str), d.to_json(), cfg.lora.to_json(), self.lora_alpha, self.part,
               tuple((n, c) for n, (c, _, _) in self.teachers.items()))
        self.fns = step_cache.get(key, lambda: distill_step.DistillFns(
            self.model_cfg, {n: (c, s) for n, (c, s, _) in self.teachers.items()},
            self.optimizer, schedule, partitioner=self.part, param_shardings=t.param_shardings,
            state_shardings=self.state_shardings,
            base_shardings=t.base_shardings or {}, lora_alpha=self.lora_alpha, loss=d.loss,
            agg=g.agg, temperature=self.temperature, chunk=g.loss_chunk,
            micro_batches=g.micro_batches, max_new=g.max_new_tokens))

    def _load_teachers(self):
        """name -> (ModelConfig, param shardings, params), placed on the mesh; frozen."""
        cfg, d = self.cfg, self.cfg.distill
        self.teachers = {}
        for i, name in enumerate(teacher_names(cfg)):
            field = f"config.distill.teachers.{name}"
            section = loading.section_from_spec(str(d.teachers[name]), cfg.model.dtype,
                                                where=field)
            if "preset" in section:  # the run's vocabulary, as the student's preset gets
                section["vocab_size"] = self.model_cfg.vocab_size
            tcfg, source = loading.abstract_model(section, field=field)
            if self.tok.vocab_size > tcfg.vocab_size:
                raise ConfigError(f"{field} has {tcfg.vocab_size} logits but the tokenizer "
                                  f"{self.tok.vocab_size} tokens.")
            if d.loss not in distill.TOKEN_FORMS and tcfg.vocab_size != self.model_cfg.vocab_size:
                raise ConfigError(f"config.distill.loss {d.loss} compares whole distributions, "
                                  f"but {field} has {tcfg.vocab_size} logits and the student "
                                  f"{self.model_cfg.vocab_size}; use reverse_kl_sampled.")
            sh = model_shardings.param_shardings(tcfg, self.part)
            params = loading.load_params(section, tcfg, source, self.part,
                                         seed=int(cfg.train.seed) + 1000 + i)
            self.teachers[name] = (tcfg, sh, jax.tree.map(jax.lax.stop_gradient, params))
        self.teacher_params = tuple(p for _, _, p in self.teachers.values())

    def teacher_index(self, names: list[str]):
        """Each row's teacher index (the order of `self.teachers`, the update's teacher_idx)."""
        import numpy as np

        order = list(self.teachers)
        return np.asarray([order.index(n) for n in names], np.int32)

    def teacher_logprobs(self, batch: dict, names: list[str]):
        """(teacher log-probs [B, S] of the completion batch, each row under its own teacher:
        one forward pass per teacher over its rows, teacher index per row)."""
        import numpy as np

        out = np.zeros(batch["mask"].shape, np.float32)
        idx = self.teacher_index(names)
        multiple = self.part.batch_size_multiple()
        for name, rows in distill.rows_by_teacher(names).items():
            sub = {k: batch[k][rows] for k in grpo_step.BATCH_KEYS}
            out[rows] = self.fns.teacher_logp(name, self.teachers[name][2], sub, multiple)
        return out * batch["mask"], idx
