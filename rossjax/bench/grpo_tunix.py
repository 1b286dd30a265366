"""`rossjax bench grpo --peer tunix`: tunix's GRPOLearner and `rossjax grpo` on the same work.

The same model folder, prompts, sizes, reward (share of digits), T = 1, beta 0, one update a
step, AdamW with global-norm clip 1 at the same learning rate as `--peer trl`
(rossjax/bench/grpo_trl.py). tunix 0.1.7 pins transformers/tokenizers versions older than
rossjax's, so it runs in its own environment: `--tunix_python PATH` (default
$ROSSJAX_TUNIX_PYTHON, else this python) names that environment's python, which runs
rossjax/bench/grpo_tunix_child.py (tunix's vanilla rollout engine, one CPU device) in a child
process. Set one up with `python -m venv /tmp/tunixvenv && /tmp/tunixvenv/bin/pip install
google-tunix==0.1.7 jax==<rossjax's jax>` (same jax, so both sides run the same XLA).
Prints each side's median seconds per step after the first (which compiles) and the ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from rossjax.bench import grpo_trl
from rossjax.errors import UsageError


def _tunix_steps(args, folder: str, d: str) -> tuple[list[float], str]:
    py = args.tunix_python or os.environ.get("ROSSJAX_TUNIX_PYTHON") or sys.executable
    spec = os.path.join(d, "tunix_spec.json")
    with open(spec, "w") as f:
        json.dump({"folder": folder, "prompts": [p["prompt"] for p in grpo_trl._prompts(args, folder)],
                   "contexts": args.contexts, "group": args.group, "new_tokens": args.new_tokens,
                   "steps": args.steps + 1, "lr": args.lr}, f)
    child = os.path.join(os.path.dirname(__file__), "grpo_tunix_child.py")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    env["JAX_PLATFORMS"] = "cpu"
    # -P: the child's folder (rossjax/bench, with a select.py) must not shadow the stdlib
    p = subprocess.run([py, "-P", child, spec], capture_output=True, text=True, env=env)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode or not lines:
        tail = (p.stderr.strip().splitlines() or [""])[-1]
        raise UsageError(f"rossjax bench grpo --peer tunix: tunix's side failed under {py} (exit "
                         f"{p.returncode}): {tail[:400]} -- give --tunix_python the python of an "
                         f"environment with google-tunix installed.")
    out = json.loads(lines[-1])
    return out["times"], f"tunix {out['tunix']}, jax {out['jax']}"


def run(args) -> int:
    if args.steps < 2:
        raise UsageError("rossjax bench grpo --peer tunix: --steps must be at least 2 (the first "
                         "step compiles and is not counted).")
    with tempfile.TemporaryDirectory() as d:
        folder = grpo_trl._model_folder(args, os.path.join(d, "model"))
        ours = [m["time_step_s"] for m in
                grpo_trl._rossjax_steps(args, folder, os.path.join(d, "rossjax"))]
        peer, version = _tunix_steps(args, folder, d)
    a, b = statistics.median(ours[1:]), statistics.median(peer[1:])
    print(f"bench grpo --peer tunix: {args.preset} (vocab 131), {args.contexts} prompts x "
          f"{args.group} candidates x {args.new_tokens} new tokens, T=1, beta=0, one update a step")
    print(f"  rossjax grpo     {a:7.2f} s/step (median of {len(ours) - 1}; all: "
          f"{', '.join(f'{x:.2f}' for x in ours)})")
    print(f"  tunix GRPOLearner {b:6.2f} s/step (median of {len(peer) - 1}; all: "
          f"{', '.join(f'{x:.2f}' for x in peer)}; {version})")
    print(f"  ratio {b / a:.2f}x (tunix s/step / rossjax s/step; target > 1)")
    return 0
