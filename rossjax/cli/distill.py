"""`rossjax distill --config=configs/distill_onpolicy.py --workdir=DIR`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.grpo import run_rl
    from rossjax.train.rl import distill_trainer

    def kl(m):
        return f"kl {m.get('kl_sampled', float('nan')):.4f}"
    return run_rl(argv, "distill", "configs/distill_onpolicy.py (or another distillation config)",
                  distill_trainer.run, kl)
