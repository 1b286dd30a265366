"""`rossjax grpo --config=configs/grpo_verifier.py --workdir=DIR`."""

from __future__ import annotations

import os
import sys
import time


def main(argv=None) -> int:
    from rossjax.train.rl import grpo

    def reward(m):
        return f"reward {m.get('reward_mean', float('nan')):.3f}"
    return run_rl(argv, "grpo", "configs/grpo_verifier.py (or another GRPO config)", grpo.run,
                  reward)


def run_rl(argv, name: str, config_hint: str, run, figure) -> int:
    """One RL-style command (grpo, distill): run it, then say how it ended and how to go on.
    `figure(metrics) -> str` is the headline number of the last step."""
    from rossjax.cli.flags import command_config, complete_message
    from rossjax.train.skeleton import interrupted_message, stop_code, stopped_message

    cfg, workdir, _ = command_config(list(argv or []), name, config_hint)
    t0 = time.time()
    try:
        out = run(cfg, workdir)
    except KeyboardInterrupt:  # Ctrl-C in set-up or the closing save (a step saves)
        print(interrupted_message(name, workdir, argv), file=sys.stderr)
        return 130
    head = figure(out["metrics"])
    if out.get("complete"):
        print(complete_message(name, workdir, out["step"], head, "grpo.steps")
              + f" History: {out['history']}.")
        return 0
    if out.get("stopped"):  # a signal or stop_after: the checkpoint is saved, say how to go on
        print(stopped_message(name, workdir, out, f"{time.time() - t0:.0f} s, {head}", argv))
        return stop_code(out)
    reward = out["metrics"].get("reward_mean", float("nan"))
    done = head if head.startswith("reward") else f"{head}, reward {reward:.3f}"
    print(f"rossjax {name}: done in {time.time() - t0:.0f} s, {done}; history {out['history']} "
          f"(relearn: rossjax curate --config.input={out['history']} "
          f"--config.output={os.path.join(workdir, 'relearn')} "
          f"--config.rows=verifier_positive --config.mask_mode=eligible "
          f"--config.tokenizer={out['tokenizer']}).")
    return 0
