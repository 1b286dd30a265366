"""RetroGen's first half: reconstruct an evidence-seeking tool-use trajectory from an expert
artifact (a related-work section, a 10-K narrative, a judgment) over a local corpus, verify it
with four model-scored signals, and write the records `rossjax retrogen` gates, thresholds and
serializes (rossjax/curate/retrogen.py: one record schema end to end).

    rossjax reconstruct --config=configs/reconstruct.py --workdir=DIR

  anchor     artifact-anchored initialization: cues (rules, then the model), task induction
             with leak rules, the instance rubric, artifact-conditioned retrieval (Ê)
  trace      the plan over Search / Open / Extract / Compare / Outline / Draft, materialized
             step by step from x̂ and Ê (never y*); observations are real executions of the
             corpus environment
  verify     s_rub, s_qual, s_grd, s_con scored by the model; Eq. 4
  baselines  ForwardGen (x̂ alone), Artifact-Only (the same reconstruction, trajectory removed)
  run        the command: every artifact ends kept / withheld / invalid, resumable
  local      `rossjax serve` as a subprocess, for `:runlocal`

The model is any OpenAI-compatible endpoint, asked through rossjax.review's client (retries,
answer cache, accounting). CPU half: never imports jax (docs/retrogen.md).
"""
