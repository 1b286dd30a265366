"""Route fingerprints of reasoning traces and selection over them (no jax).

  fingerprint.py  `fingerprint(texts, domain)`: a fixed-length vector for the structure of a trace
  step_vocab.py   the per-domain step labels and cue phrases (data, not code)
  selection.py    `select(fingerprints, budget, method)`: diverse / similar / random / topology

The public names are re-exported by `rossjax.curate` (`curate.fingerprint`, `curate.select`).
This package's __init__ imports nothing, so the submodule `rossjax.routes.fingerprint` and the
function of the same name never shadow each other.
"""
