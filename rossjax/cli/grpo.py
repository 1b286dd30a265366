"""`rossjax grpo --config=configs/grpo_verifier.py --workdir=DIR`."""

from __future__ import annotations

import os
import sys
import time


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config, complete_message
    from rossjax.train.rl import grpo
    from rossjax.train.skeleton import interrupted_message, stop_code, stopped_message

    cfg, workdir, _ = command_config(list(argv or []), "grpo",
                                     "configs/grpo_verifier.py (or another GRPO config)")
    t0 = time.time()
    try:
        out = grpo.run(cfg, workdir)
    except KeyboardInterrupt:  # Ctrl-C in set-up or the closing save (a step saves)
        print(interrupted_message("grpo", workdir, argv), file=sys.stderr)
        return 130
    if out.get("complete"):
        reward = f"reward {out['metrics'].get('reward_mean', float('nan')):.3f}"
        print(complete_message("grpo", workdir, out["step"], reward, "grpo.steps")
              + f" History: {out['history']}.")
        return 0
    reward = f"reward {out['metrics'].get('reward_mean', float('nan')):.3f}"
    if out.get("stopped"):  # a signal or stop_after: the checkpoint is saved, say how to go on
        print(stopped_message("grpo", workdir, out, f"{time.time() - t0:.0f} s, {reward}", argv))
        return stop_code(out)
    print(f"rossjax grpo: done in {time.time() - t0:.0f} s, reward "
          f"{out['metrics'].get('reward_mean', float('nan')):.3f}; history {out['history']} "
          f"(relearn: rossjax curate --config.input={out['history']} "
          f"--config.output={os.path.join(workdir, 'relearn')} "
          f"--config.rows=verifier_positive --config.mask_mode=eligible "
          f"--config.tokenizer={out['tokenizer']}).")
    return 0
