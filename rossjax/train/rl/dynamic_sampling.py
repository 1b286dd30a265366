"""DAPO's dynamic sampling, host side: from the scored batches of one step (the first batch and
its refill rounds) to the one update batch of `contexts` groups whose rewards do not all agree.

A group whose scorable rewards all agree has advantage 0 everywhere (rossjax.train.rl.advantages.
uniform_groups): it teaches nothing and only dilutes the loss normalizer, so it is dropped and
the step samples more prompts, at most `max_refill_rounds` extra rounds. Still short after the
cap, the batch is filled with dropped groups whose loss mask is 0 (static shapes: the update
keeps its compiled size; a masked row adds nothing to the loss, its gradient or its normalizer).

Nothing is lost: every sampled candidate stays in the step's records (history.jsonl), in the
order kept, filler, then the rest, and its record says which it was in
`source.dynamic_sampling` ("kept", "filler_masked", "dropped_uniform", "surplus": an informative
group beyond the batch's `contexts`). Rewards, verdicts and reward metrics cover every sampled
candidate; the update batch (loss, entropy, lengths) covers kept and filler rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rossjax.train.rl.advantages import uniform_groups


def _cat(parts):
    """Concatenate rows; 2-D arrays of different widths are right-padded with 0 first."""
    parts = [np.asarray(p) for p in parts]
    if parts[0].ndim == 2:
        w = max(p.shape[1] for p in parts)
        parts = [np.pad(p, ((0, 0), (0, w - p.shape[1]))) for p in parts]
    return np.concatenate(parts, axis=0)


def plan(totals: list, contexts: int, group_size: int):
    """Which groups of the step's rounds make the update batch.

    `totals`: each round's rewards [n_r * G]. Returns (kept, filler, rest), lists of
    (round, group) with kept + filler = `contexts` groups (when the rounds hold that many) and
    rest = every other group, each labelled "dropped_uniform" or "surplus"."""
    informative, uniform = [], []
    for r, total in enumerate(totals):
        for j, u in enumerate(uniform_groups(total, group_size)):
            (uniform if u else informative).append((r, j))
    kept = informative[:contexts]
    filler = uniform[:contexts - len(kept)]
    rest = [(rg, "surplus") for rg in informative[contexts:]] + \
           [(rg, "dropped_uniform") for rg in uniform[len(filler):]]
    return kept, filler, rest


def assemble(rounds: list, contexts: int, group_size: int):
    """One scored batch (the type of `rounds[0]`, grpo's _Scored: sampled, cpu_scores, reward,
    rewards, update_rows, entropy) from a step's rounds: kept + filler groups in the update
    arrays (filler masked out), every group in the records. Returns (scored, metrics); the caller recomputes anything that
    is a mean over the batch (importance-sampling metrics)."""
    G = group_size
    kept, filler, rest = plan([sc.reward for sc in rounds], contexts, G)
    batch_groups = kept + filler
    all_groups = batch_groups + [rg for rg, _ in rest]
    label = {**{rg: "kept" for rg in kept}, **{rg: "filler_masked" for rg in filler},
             **dict(rest)}

    def rows(groups):
        return [(r, j * G + k) for r, j in groups for k in range(G)]

    def gather(groups, get):
        return _cat([get(rounds[r])[i:i + 1] for r, i in rows(groups)])

    in_batch = rows(batch_groups)
    full = {k: gather(batch_groups, lambda sc, k=k: sc.update_rows[k])
            for k in rounds[0].update_rows}
    masked = np.asarray([rg in filler for rg in batch_groups for _ in range(G)])
    full["mask"] = np.where(masked[:, None], 0, full["mask"]).astype(full["mask"].dtype)
    gen0 = rounds[0].sampled["gen"]
    gen = dataclasses.replace(
        gen0, tokens=gather(batch_groups, lambda sc: sc.sampled["gen"].tokens),
        logprobs=gather(batch_groups, lambda sc: sc.sampled["gen"].logprobs),
        lengths=gather(batch_groups, lambda sc: sc.sampled["gen"].lengths),
        finish_reason=[rounds[r].sampled["gen"].finish_reason[i] for r, i in in_batch])
    batch = {k: gather(batch_groups, lambda sc, k=k: sc.sampled["batch"][k])
             for k in rounds[0].sampled["batch"]}
    batch["mask"] = full["mask"]
    records = []
    for r, i in rows(all_groups):
        rec = rounds[r].sampled["records"][i]
        rec["source"]["dynamic_sampling"] = label[(r, i // G)]
        records.append(rec)
    cur = {"tasks": [rounds[r].sampled["tasks"][j] for r, j in all_groups], "records": records,
           "batch": batch, "gen": gen, "sample_s": sum(sc.sampled["sample_s"] for sc in rounds)}
    everyone = rows(all_groups)
    scored = dataclasses.replace(
        rounds[0], sampled=cur, update_rows=full,
        entropy=gather(batch_groups, lambda sc: sc.entropy),
        cpu_scores=[rounds[r].cpu_scores[i] for r, i in everyone],
        reward=np.asarray([rounds[r].reward[i] for r, i in everyone]),
        rewards={n: np.asarray([rounds[r].rewards[n][i] for r, i in everyone])
                 for n in rounds[0].rewards})
    metrics = {"dynamic_refill_rounds": len(rounds) - 1,
               "dynamic_groups_sampled": len(all_groups),
               "dynamic_groups_uniform": sum(lab in ("filler_masked", "dropped_uniform")
                                             for lab in label.values()),
               "dynamic_groups_filler": len(filler)}
    return scored, metrics
