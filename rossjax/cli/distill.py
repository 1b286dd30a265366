"""`rossjax distill --config=configs/distill_onpolicy.py --workdir=DIR`."""

from __future__ import annotations

import os
import sys
import time


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config, complete_message
    from rossjax.train.rl import distill_trainer
    from rossjax.train.skeleton import interrupted_message, stop_code, stopped_message

    cfg, workdir, _ = command_config(list(argv or []), "distill",
                                     "configs/distill_onpolicy.py (or another distillation config)")
    t0 = time.time()
    try:
        out = distill_trainer.run(cfg, workdir)
    except KeyboardInterrupt:  # Ctrl-C in set-up or the closing save (a step saves)
        print(interrupted_message("distill", workdir, argv), file=sys.stderr)
        return 130
    kl = f"kl {out['metrics'].get('kl_sampled', float('nan')):.4f}"
    if out.get("complete"):
        print(complete_message("distill", workdir, out["step"], kl, "grpo.steps")
              + f" History: {out['history']}.")
        return 0
    if out.get("stopped"):
        print(stopped_message("distill", workdir, out, f"{time.time() - t0:.0f} s, {kl}", argv))
        return stop_code(out)
    print(f"rossjax distill: done in {time.time() - t0:.0f} s, {kl}, reward "
          f"{out['metrics'].get('reward_mean', float('nan')):.3f}; history {out['history']} "
          f"(relearn: rossjax curate --config.input={out['history']} "
          f"--config.output={os.path.join(workdir, 'relearn')} "
          f"--config.rows=verifier_positive --config.mask_mode=eligible "
          f"--config.tokenizer={out['tokenizer']}).")
    return 0
