"""A warm-up generator for PROPEL's `:runlocal` runs, as the vault demo starts from one.

A random tiny model never writes a task that passes the validity check W, so a solver-in-the-loop
run from it pays -0.2 every step and never calls its solver. This clones the tiny preset (ASCII
tokenizer, chatml) on a few short, valid AZR induction tasks (`TASKS`) answering the `:runlocal`
prompt (`gen:induction`, context "instruction"), so that from the first GRPO step many candidates
pass W and are posed to the solver (`solver_trials` > 0):

    python -m rossjax.train.propel.warmup /tmp/propel-warm        # prints the grpo command
    rossjax grpo --config=configs/propel_sil.py:runlocal \\
        --config.model.path=/tmp/propel-warm/hf --workdir=/tmp/propel-sil

Math (`:runlocal,math`): the same with `--math`, on short ```problem blocks (`PROBLEMS`), so
that the two stand-in oracles are asked (measured: `oracle_trials` 32 a step, all 8 candidates
valid; the build took 22 min on this shared CPU at load ~17). In-process SFT (optax AdamW on the
masked NLL `sft.step.batch_nll` computes, prompt tokens masked; 300 full-batch steps, 1-3
minutes on this shared 2-core CPU), saved as an HF folder. A stand-in that knows a handful of
tasks by heart, not a generator of new ones.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

# (f's body on its argument a, the message): each, with inputs 0..9, passes check_task
TASKS = (("a + 1", "adds one"), ("a * 2", "doubles it"), ("a - 3", "subtracts three"),
         ("a * a", "squares it"), ("a + 7", "adds seven"), ("10 - a", "ten minus it"),
         ("a * 3 + 1", "triples, plus one"), ("a * a + a", "square plus itself"))
PROBLEMS = ("What is 3 + 4?", "What is 6 times 7?", "What is 20 minus 8?", "What is 2 to the 5?",
            "What is 81 divided by 9?", "What is 13 + 29?")


def task_answer(body: str, message: str) -> str:
    inputs = "\n".join(str(i) for i in range(10))
    return (f"```python\ndef f(a):\n    return {body}\n```\n```inputs\n{inputs}\n```\n"
            f"```message\n{message}\n```")


def demonstrations(math: bool = False) -> list[str]:
    """The answers the warm-up is cloned on (each passes W)."""
    if math:
        return [f"## Problem\n```problem\n{p}\n```" for p in PROBLEMS]
    return [task_answer(b, m) for b, m in TASKS]


def prompt(math: bool = False) -> str:
    """The `:runlocal` generator prompt (gen:induction with context "instruction"; gen:math_task
    with its runlocal context)."""
    from rossjax.configs import propel_sil
    from rossjax.train.rl import rollout

    c = propel_sil.get_config("runlocal" + (",math" if math else ""))
    src = rollout.TaskSource(c.data.tasks, seed=c.data.seed, induction=c.data.get("induction"),
                             math=c.data.get("math"))
    return src.next(1)[0]["prompt"]


def build(out: str, *, math: bool = False, steps: int = 300, seed: int = 0,
          lr: float = 1e-2) -> str:
    """Train the warm-up into `out`; returns its HF folder (out/hf)."""
    import jax
    import jax.numpy as jnp
    import optax

    from rossjax import models
    from rossjax.configs.common import TINY_PRESET
    from rossjax.templates import render_prompt
    from rossjax.tokenizers import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer
    from rossjax.train import losses

    tok = load_tokenizer(write_ascii_tokenizer(os.path.join(out, "tokenizer")))
    head = tok.encode(render_prompt([{"role": "user", "content": prompt(math)}], "chatml", tok))
    rows = [head + tok.encode(a) + [tok.eos_id] for a in demonstrations(math)]
    width = max(map(len, rows))
    ids, mask, seg = (np.zeros((len(rows), width), np.int32) for _ in range(3))
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, len(head):len(r)], seg[i, :len(r)] = r, 1, 1
    pos = np.broadcast_to(np.arange(width, dtype=np.int32), ids.shape)
    cfg = models.get_preset(TINY_PRESET, vocab_size=tok.vocab_size)
    params = models.init_params(cfg, jax.random.PRNGKey(seed))
    opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, steps // 10, steps, lr / 10))
    state = opt.init(params)
    batch = {"input_ids": ids, "loss_mask": mask, "segment_ids": seg, "positions": pos}

    @jax.jit
    def update(params, state):
        def loss(p):  # sft.step.batch_nll's masked NLL, from the core losses (rooms stay apart)
            targets, m = losses.shift_targets(batch["input_ids"], batch["loss_mask"],
                                              batch["segment_ids"])
            h = models.hidden_states(cfg, p, batch["input_ids"], batch["positions"],
                                     batch["segment_ids"])
            w, vocab_major = losses.head_weights(cfg, p)
            total, count = losses.chunked_masked_nll(h, w, targets, m, width, vocab_major)
            return total / jnp.maximum(count, 1.0)
        value, grads = jax.value_and_grad(loss)(params)
        upd, state = opt.update(grads, state, params)
        return optax.apply_updates(params, upd), state, value

    for _ in range(steps):  # every row every step: a handful of rows, learnt by heart
        params, state, value = update(params, state)
    build.last_loss = float(value)  # per-token NLL of the demonstrations after the last step
    hf = os.path.join(out, "hf")
    models.save_hf(cfg, params, hf)
    return hf


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rossjax.train.propel.warmup",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--math", action="store_true", help="warm up on Math problems instead")
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args(argv)
    hf = build(a.out, math=a.math, steps=a.steps)
    print(f"warm-up generator: {hf} (demonstration loss {build.last_loss:.4f})\nnext: rossjax grpo --config=configs/propel_sil.py:runlocal"
          f"{',math' if a.math else ''} --config.model.path={hf} --workdir=/tmp/propel-sil")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
