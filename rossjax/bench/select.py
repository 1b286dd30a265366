"""`rossjax bench select [--n=2000000] [--budget=100000] [--workers=2] [--chunk=4000]`

Fingerprints N synthetic ~4,000-character math traces and selects a budget with `diverse`.
Traces come from a step grammar: route families (label sequences) rendered from per-label
sentence templates with neutral filler, generated in streamed chunks inside the worker processes
(the parent never holds raw texts, only the [N, 64] float32 fingerprints). Prints traces/s, the
wall time of each phase, peak RSS (self + children), and the comparison with the peers in the
same run: the slow obvious labeller (one regex search per label per step) and `random` selection
(families covered at the same budget). Targets on 2 cores: >= 3,000 traces/s, selection <= 120 s,
peak RSS <= 8 GB. The full run takes about 15 minutes on an otherwise idle 2-core machine
(fingerprinting ~11,000 traces/s of worker CPU time); `--n=200000` about 2.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import resource
import sys
import time

import numpy as np

# Per-label step templates ({v} variable, {a},{b},{c} numbers, {w} noun). Filler sentences use
# words that are no cue of any label, so the label of a step comes from its template only.
TEMPLATES = {
    "setup": ["Let {v} be the {w} we are after.", "Define {v} as the {w} of the figure.",
              "We are given that {v} equals {a}.", "Denote by {v} the unknown {w}.",
              "We need to find the {w} called {v}."],
    "compute": ["Compute {a} * {b} = {c}.", "Calculating the {w} gives {c}.",
                "Evaluating the expression yields {c}.", "Multiplying {a} by {b} we get {c}.",
                "So {v} = {a} + {b} = {c}."],
    "case_split": ["Case {a}: {v} is even.", "Consider the case where {v} exceeds {a}.",
                   "Either {v} is positive or it is not.", "Otherwise {v} is at most {a}."],
    "substitute": ["Substitute {v} = {a} into the {w}.", "Rewrite the {w} in terms of {v}.",
                   "Simplifying, the {w} becomes {v} - {a}.", "Plug {a} in for {v}.",
                   "Expand the {w} around {v}."],
    "hypothesize": ["Maybe the {w} is {a}.", "Perhaps {v} equals {b}.", "Guess that {v} is {a}.",
                    "Assume for now that {v} is {c}.", "It seems the {w} could be {a}."],
    "verify": ["Check: {a} * {b} is {c}, which holds.", "Verify that {v} = {a} satisfies the {w}.",
               "Double-check the {w} with {v} = {b}.", "Let us confirm the value {c}.",
               "Sanity check on the {w}: {c}."],
    "backtrack": ["Wait, that step was wrong.", "Oops, the {w} is not {a}.",
                  "Actually, I made an error in the {w}.", "That was a mistake; redo the {w}.",
                  "Let me reconsider the {w}."],
    "conclude": ["Therefore the answer is {c}.", "Hence the answer is {v} = {c}.",
                 "The final answer is {c}.", "In conclusion, {v} is {c}."],
}
FILLER = ["The {w} here is the main object.", "This is the {w} from the statement.",
          "Note that the {w} is the one on the left.", "The {w} of the {w} is the key part here.",
          "We keep the {w} for the next part.", "This is a standard {w}.",
          "The {w} and the {w} are the same kind of object.", "Nothing more about the {w} for now."]
NOUNS = ["triangle", "polynomial", "sequence", "area", "ratio", "remainder", "angle", "integer",
         "fraction", "perimeter", "coefficient", "root", "matrix", "probability", "digit"]
LABELS = list(TEMPLATES)


def render_step(label: str, rng: np.random.Generator, filler: int = 2) -> str:
    def fill(t):
        a, b = (int(v) for v in rng.integers(2, 99, 2))
        return t.format(v="xyzn"[int(rng.integers(4))], a=a, b=b, c=a * b,
                        w=NOUNS[int(rng.integers(len(NOUNS)))])
    parts = [fill(TEMPLATES[label][int(rng.integers(len(TEMPLATES[label])))])]
    parts += [fill(FILLER[int(rng.integers(len(FILLER)))]) for _ in range(filler)]
    return " ".join(parts)


def family_routes(n_families: int, seed: int, length=(8, 14)) -> list[list[str]]:
    """Distinct label sequences that start with setup and end with conclude."""
    rng = np.random.Generator(np.random.PCG64([seed, 7]))
    body = LABELS[1:-1]
    return [["setup"] + [body[int(i)] for i in rng.integers(0, len(body), int(rng.integers(*length)))]
            + ["conclude"] for _ in range(n_families)]


def synth_traces(n: int, routes: list[list[str]], seed: int, *, mutate: int = 1, filler: int = 2,
                 weights=None):
    """n traces (texts, family ids): each a family route with `mutate` steps relabelled."""
    rng = np.random.Generator(np.random.PCG64(seed))
    fam = rng.choice(len(routes), n, p=weights)
    texts = []
    for f in fam:
        route = list(routes[f])
        for _ in range(mutate):
            route[int(rng.integers(1, len(route) - 1))] = LABELS[int(rng.integers(1, len(LABELS) - 1))]
        texts.append("\n\n".join(render_step(lab, rng, filler) for lab in route))
    return texts, fam


class _Bank:
    """Pre-rendered step variants so a worker builds a 4,000-char trace by joining, not formatting."""

    def __init__(self, seed: int, variants: int = 64):
        rng = np.random.Generator(np.random.PCG64([seed, 1]))
        self.steps = {lab: [render_step(lab, rng, filler=int(rng.integers(2, 4))) for _ in range(variants)]
                      for lab in LABELS}
        self.variants = variants


def _work(args):
    start, size, seed, n_families = args
    from rossjax.routes.fingerprint import fingerprint
    bank = _Bank(seed)
    routes = family_routes(n_families, seed, length=(24, 30))
    rng = np.random.Generator(np.random.PCG64([seed, start]))
    t0 = time.perf_counter()
    fam = rng.integers(0, n_families, size)
    pick = rng.integers(0, bank.variants, (size, 32))
    texts = []
    for i, f in enumerate(fam):
        route = list(routes[f])
        route[int(rng.integers(1, len(route) - 1))] = LABELS[int(rng.integers(1, len(LABELS) - 1))]
        texts.append("\n\n".join(bank.steps[lab][pick[i, j]] for j, lab in enumerate(route)))
    t1, c1 = time.perf_counter(), time.process_time()
    fp = fingerprint(texts, "math", 64, seed)
    t2, c2 = time.perf_counter(), time.process_time()
    chars = sum(len(t) for t in texts)
    return start, fp, fam, t1 - t0, t2 - t1, c2 - c1, chars


def _naive_labels(texts, domain="math"):
    """The slow obvious labeller: split on blank lines, one regex search per label per step."""
    from rossjax.routes.step_vocab import STEP_VOCAB
    rx = [(lab, re.compile(r"\b(?:" + "|".join(c) + ")")) for lab, c in STEP_VOCAB[domain]]
    out = []
    for t in texts:
        out.append([next((lab for lab, r in rx if r.search(s.lower())), "other")
                    for s in re.split(r"\n\s*\n", t) if s.strip()])
    return out


def peak_rss_gb() -> float:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (self_kb + kids_kb) / 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="rossjax bench select")
    p.add_argument("--n", type=int, default=2_000_000)
    p.add_argument("--budget", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk", type=int, default=4000)
    p.add_argument("--families", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from tqdm import tqdm

    from rossjax.routes.selection import cluster_pool, default_clusters, select

    fps = np.empty((a.n, 64), np.float32)
    fams = np.empty(a.n, np.int64)
    jobs = [(s, min(a.chunk, a.n - s), a.seed, a.families) for s in range(0, a.n, a.chunk)]
    gen_s = fp_s = fp_cpu = 0.0
    chars = 0
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")  # fresh workers: no inherited BLAS threads or parent memory
    with ctx.Pool(a.workers) as pool, tqdm(total=a.n, unit="trace", file=sys.stderr) as bar:
        for start, fp, fam, g, f, fc, c in pool.imap_unordered(_work, jobs):
            fps[start:start + len(fp)] = fp
            fams[start:start + len(fp)] = fam
            gen_s, fp_s, fp_cpu, chars = gen_s + g, fp_s + f, fp_cpu + fc, chars + c
            bar.update(len(fp))
    wall_fp = time.perf_counter() - t0
    fp_rate = a.n / (fp_s / a.workers)
    print(f"traces: {a.n:,} of mean {chars / a.n:,.0f} chars, {a.workers} worker processes")
    print(f"generate+fingerprint wall: {wall_fp:.1f} s = {a.n / wall_fp:,.0f} traces/s end to end "
          f"(generation {gen_s:.1f} cpu-s, fingerprinting {fp_s:.1f} cpu-s)")
    print(f"fingerprinting alone: {fp_rate:,.0f} traces/s on {a.workers} workers by wall time "
          f"(target >= 3,000); {a.n / (fp_cpu / a.workers):,.0f} traces/s by worker CPU time "
          f"(differs when other jobs share the cores; load average now {os.getloadavg()[0]:.1f})")

    sample, _ = synth_traces(300, family_routes(a.families, a.seed, (24, 30)), a.seed + 1, filler=2)
    from rossjax.routes.fingerprint import fingerprint
    fingerprint(sample[:10])  # compile the vocabulary outside the timing
    t = time.perf_counter(); fingerprint(sample); ours = time.perf_counter() - t
    t = time.perf_counter(); _naive_labels(sample); naive = time.perf_counter() - t
    print(f"peer (split + one regex search per label per step, labels only) vs rossjax "
          f"(labels + features): peer takes {naive / ours:.2f}x the time ({len(sample) / naive:,.0f} vs {len(sample) / ours:,.0f} traces/s, one core)")

    k = default_clusters(a.n, a.budget)
    t = time.perf_counter()
    cl = cluster_pool(fps, k, a.seed)
    t_km = time.perf_counter() - t
    t = time.perf_counter()
    chosen = select(fps, a.budget, "diverse", seed=a.seed, clustering=cl)
    t_kc = time.perf_counter() - t
    rnd = select(fps, a.budget, "random", seed=a.seed)
    print(f"select diverse {a.budget:,} of {a.n:,} with {k} clusters: k-means {t_km:.1f} s + "
          f"per-cluster k-center {t_kc:.1f} s = {t_km + t_kc:.1f} s (target <= 120 s)")
    from rossjax.curate.subset import mean_pairwise_distance

    fd, fr = len(np.unique(fams[chosen])), len(np.unique(fams[rnd]))
    md, mr = mean_pairwise_distance(fps[chosen], a.seed), mean_pairwise_distance(fps[rnd], a.seed)
    print(f"families covered: diverse {fd} vs random {fr} of {len(np.unique(fams))}; mean pairwise "
          f"distance diverse {md:.3f} vs random {mr:.3f} (ratio {md / max(mr, 1e-12):.2f})")
    print(f"peak RSS (self + children): {peak_rss_gb():.2f} GB (target <= 8 GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
