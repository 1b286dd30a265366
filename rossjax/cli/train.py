"""`rossjax train --config=configs/ross_sft.py --config.model.path=... --workdir=...`."""

from __future__ import annotations

import os
import sys
import time


def main(argv=None) -> int:
    import jax

    from rossjax.cli.flags import command_config, complete_message
    from rossjax.cli.recipe import check_train_recipe
    from rossjax.train.sft import trainer as loop
    from rossjax.train.skeleton import interrupted_message, stop_code, stopped_message

    cfg, workdir, _ = command_config(list(argv or []), "train",
                                     "configs/ross_sft.py (or another SFT config)")
    check_train_recipe(cfg)
    t0 = time.time()
    try:
        out = loop.run(cfg, workdir)
    except KeyboardInterrupt:  # Ctrl-C in set-up or the closing save (a step saves)
        print(interrupted_message("train", workdir, argv), file=sys.stderr)
        return 130
    if out.get("complete"):
        if jax.process_index() == 0:
            # num_steps only extends a run it caps; otherwise the epochs decide its length
            capped = 0 < int(cfg.train.num_steps) <= int(out["step"])
            print(complete_message("train", workdir, out["step"],
                                   f"loss {out.get('loss', float('nan')):.4f}",
                                   "train.num_steps" if capped else "train.epochs"),
                  file=sys.stdout)
        return 0
    if out.get("stopped"):  # a signal: the checkpoint is saved, say how to go on
        if jax.process_index() == 0:
            print(stopped_message("train", workdir, out, f"loss {out.get('loss', float('nan')):.4f}",
                                  argv), file=sys.stdout)
        return stop_code(out)
    if jax.process_index() == 0:
        print(f"rossjax train: step {out['step']}, loss {out.get('loss', float('nan')):.4f}, "
              f"{time.time() - t0:.0f} s; checkpoints in {os.path.join(workdir, 'checkpoints')}.",
              file=sys.stdout)
    return 0
