"""`rossjax plan --config=configs/ross_sft.py --topology=v5e:2x4 [--num_slices=N]
[--prompt_len=N] [--seq_len=N] [--out=plan.json] [--config.x=y ...]`: compile every program the config's
command runs (train: the SFT step; grpo: the update, the log-prob pass, the rollout engine's
programs and the probe reward's forward; extract: its forward batch) with the TPU compiler for
that slice, on this machine, and say per device what fits. Exit 2 when one does not fit.
Needs libtpu (pip install 'rossjax[tpu]'); the model comes from config.model.preset or the
config.json of config.model.path (extract: config.model, preset:NAME or a folder); weights are
never read."""

from __future__ import annotations

import os
import sys


def _flags(fv):
    from absl import flags

    flags.DEFINE_string("topology", None, "TPU slice: v5e:2x4, v5p:4x4x4, v6e-64, ...",
                        flag_values=fv)
    flags.DEFINE_integer("num_slices", 1, "slices joined by DCN (multi-slice)", flag_values=fv)
    flags.DEFINE_integer("prompt_len", 512, "grpo: prompt tokens per row (rows are "
                         "prompt_len + grpo.max_new_tokens long)", flag_values=fv)
    flags.DEFINE_integer("seq_len", 4096, "extract: tokens per row (the length bucket planned)",
                         flag_values=fv)
    flags.DEFINE_string("out", "", "plan.json path (default WORKDIR/plan.json, else ./plan.json)",
                        flag_values=fv)


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.errors import UsageError

    cfg, workdir, fv = command_config(list(argv or []), "plan", "configs/ross_sft.py",
                                      needs_workdir=False, extra_flags=_flags)
    if not fv.topology:
        raise UsageError("needs --topology=NAME (e.g. v5e:2x4, v5p:4x4x4, v6e-64).")
    from rossjax import plan as plan_lib
    from rossjax.plan import report

    name = str(fv["config"].config_filename) if hasattr(fv["config"], "config_filename") else ""
    plan = plan_lib.run(cfg, fv.topology, num_slices=int(fv.num_slices),
                        prompt_len=int(fv.prompt_len), seq_len=int(fv.seq_len),
                        config_name=name)
    out = fv.out or os.path.join(workdir or ".", "plan.json")
    report.write_json(plan, out)
    print(report.table(plan))
    print(f"rossjax plan: wrote {out}.")
    sentence = report.not_fit_sentence(plan)
    if sentence:
        print(sentence, file=sys.stderr)
        return 2
    return 0
