"""The model shape and training settings the experiments share, and the routes experiment's
warm-up: the "SFT model" that knows every route before relearning.

Teachers of all six route families (families.SHARES: the pool's mix) write demonstrations of
problems no experiment trains or evaluates on; `rossjax curate` (positive_sft rows and mask)
and `rossjax train` from a random initialization turn them into a model that writes every
route. Every
selection and seed then relearns from this one checkpoint, so their differences come from the
rows each selection kept. It lives in DIR/warmup-<size>.
"""

from __future__ import annotations

import os

from rossjax.repro import families, stages, tasks

# A ~360k-parameter Qwen2-shaped model over byte-level ASCII tokens. Many small heads matter:
# reading the pair a line works on out of the prompt took this shape ~200 steps, and ~500 with
# 4 heads of 32 (a 2-layer d=64 model had not learned it after 300).
SHAPE = dict(vocab_size=256, d_model=128, n_layers=2, n_heads=8, n_kv_heads=8, head_dim=16,
             ffn_dim=256)
# batch: rollouts per step. Relearning starts from a trained model, so its peak lr is lower and
# reached slowly: Adam's first updates move every weight by ~lr whatever its gradient (1e-3 with
# a 5-step warm-up took the warm-up model from loss 0.3 to 3.2 on the relearning data).
TRAIN = dict(batch=32, seq_len=128, micro=4, lr=3e-3)
FINETUNE = dict(lr=3e-4, warmup_frac=0.2)
# The quick warm-up (repro routes --quick, in make test) takes 16 rollouts a step (issue 46):
# training 41 -> 21 s, and similar's collapse still shows (coverage 1.00 against random's 1.55;
# 1.56 at 32).
SIZES = {"full": dict(n_warm=1000, steps=400), "quick": dict(n_warm=1000, steps=300, batch=16)}
N_PAIRS = 2
# Problems: the warm-up set, then a reserve each experiment splits into its train/test sets.
N_PROBLEMS = 4800


def problems(seed: int = 0):
    """(warm-up problems, reserve): disjoint; experiments take theirs from the reserve."""
    (allp,) = tasks.problem_split(N_PAIRS, [N_PROBLEMS], seed=seed)
    n = SIZES["full"]["n_warm"]
    return allp[:n], allp[n:]


def train_kw(finetune: bool = True, **over) -> dict:
    """stages.train's settings: TRAIN (+ FINETUNE), with `over` (None values: keep TRAIN's)."""
    kw = dict(TRAIN, vocab_size=SHAPE["vocab_size"], model={}, **(FINETUNE if finetune else {}))
    return {**kw, **{k: v for k, v in over.items() if v is not None}}


def build(root: str, quick: bool, tok_path: str, log=print) -> dict:
    """Build (or reuse) the warm-up; returns {"hf": folder, "curated": report summary}."""
    size = SIZES["quick" if quick else "full"]
    wd = os.path.join(root, f"warmup-{'quick' if quick else 'full'}")
    key = dict(size=size, shape=SHAPE, train=TRAIN, shares=families.SHARES)
    st = stages.Stages(wd, log, key=key)
    warm_p = problems()[0][:size["n_warm"]]
    roll = os.path.join(wd, "route_teachers.jsonl")
    st.run("rollouts", lambda: len(stages.write_jsonl_rows(
        roll, families.pool(warm_p, 1, families.SHARES, seed=11))))
    cur = os.path.join(wd, "curated")
    rep = st.run("curate", lambda: stages.curated_summary(stages.curate(
        roll, cur, tok_path, rows="verifier_positive", mask_mode="eligible")))
    init = stages.init_model(os.path.join(wd, "init"), 0, **SHAPE)
    run = os.path.join(wd, "run")
    st.run("train", lambda: stages.train(cur, run, "positive_sft", seed=0, steps=size["steps"],
                                         init=init, rows=rep["kept"],
                                         **train_kw(False, batch=size.get("batch"))))
    return {"hf": os.path.join(run, "hf"), "curated": rep, "steps": size["steps"],
            "rows": size["n_warm"]}
