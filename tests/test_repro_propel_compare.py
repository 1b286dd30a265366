"""rossjax repro propel's comparison arms (rossjax/repro/propel_compare.py): the SIL solver as a
`fn` solver judged in the sandbox, each arm's GRPO flags accepted by the GRPO config check, a run
history labelled for `rossjax aux-set`, and claims that follow the numbers. The SIL arm runs end
to end in `rossjax repro propel --quick` (tests/test_repro_propel_quick.py); wco, adversarial and transfer run
in full runs only, so their wiring is checked here without training."""

import json
import os

import numpy as np
import pytest

from rossjax.repro import propel_compare as cmp, propel_tasks as pt


def _solver_task(fam, seed, i):
    from rossjax.verify import induction_task as it

    t = pt.sample_task(np.random.default_rng(seed), fam)
    task = it.parse_generated_task(pt.task_answer(t))
    return it.solver_task(task, it.Protocol(), f"t{i}")


def test_solver_fn_programs_pass_in_the_sandbox_exactly_when_the_solver_trials_do():
    import zlib

    from rossjax.train.propel import solvers

    seen = set()
    for i, (fam, seed) in enumerate((("aff", 3), ("add", 4), ("cond", 5), ("aff", 8))):
        st = _solver_task(fam, seed, i)
        assert st is not None, fam
        programs = pt.solver_fn(st, 8, 11)
        verdicts = [solvers.judge(st, p) for p in programs]
        rng = np.random.default_rng([11, zlib.crc32(st["id"].encode())])
        want = pt.Solver(**pt.SOLVER).trials(st, 8, rng)
        assert verdicts == want, (fam, programs)
        seen.update(verdicts)
        assert pt.solver_fn(st, 8, 11) == programs  # seeded
    assert seen == {True, False}


def _ctx(tmp_path):
    probe = str(tmp_path / "probe" / "selected_probe")
    os.makedirs(os.path.dirname(probe))
    for p in (probe, probe + "_b", probe + "_c", probe + "_aux"):
        open(p + ".json", "w").write("{}")  # the GRPO config check asks for manifests only
    for d in ("gen", "gen2"):
        os.makedirs(tmp_path / d / "hf")  # and for the reference's folder
    return {"gen_hf": str(tmp_path / "gen" / "hf"), "gen2": str(tmp_path / "gen2" / "hf"),
            "probe": probe, "wco": [probe + "_b", probe + "_c"], "aux": probe + "_aux"}


@pytest.mark.parametrize("arm", ("sil", "wco", "adversarial", "transfer"))
def test_each_arm_is_a_grpo_run_its_config_accepts(arm, tmp_path):
    from rossjax.cli.flags import parse_config
    from rossjax.resources import config_path
    from rossjax.train.rl import grpo_config

    ctx = _ctx(tmp_path)
    p = cmp.plan(arm, ctx)
    name, _, variant = p["config"].partition(":")
    cfg, _, _ = parse_config([f"--config={config_path(name)}:{variant}",
                              f"--config.model.path={p['policy']}", *p["reward"]])
    grpo_config.check_config(cfg)
    r = cfg.reward
    if arm == "sil":
        assert r.functions == ("solver",) and r.solver.kind == "fn"
        assert (r.solver.k, r.solver.lo, r.solver.hi) == (8, 1 / 8, 3 / 8)  # propel.K, LO, HI
        assert r.solver.fn == "rossjax.repro.propel_tasks:solver_fn"
        return
    assert r.functions == ("probe",) and r.probe.path == ctx["probe"]
    if arm == "wco":
        assert r.probe.ensemble.split(",") == ctx["wco"] and not r.probe.auxiliary
    if arm == "adversarial":
        assert r.probe.auxiliary == ctx["aux"] and not r.probe.ensemble
    if arm == "transfer":  # policy swapped, probe and its reference fixed
        assert cfg.model.path == ctx["gen2"] and r.probe.reference.path == ctx["gen_hf"]
    else:
        assert cfg.model.path == ctx["gen_hf"] and not r.probe.reference.path


def test_quick_runs_sil_only_and_full_every_arm():
    assert cmp.arms(True) == ("sil",)
    assert set(cmp.arms(False)) == {"sil", "wco", "adversarial", "transfer_base", "transfer"}
    with pytest.raises(ValueError):
        cmp.plan("transfer_base", {})  # evaluated as it is, never trained


def test_a_run_history_labelled_for_aux_set(tmp_path):
    """label_history writes what `rossjax aux-set` reads; its collapsed family and false
    positives come out as negatives, the corpus' band tasks as positives."""
    from rossjax.cli import main
    from rossjax.repro import stages

    _, tok = stages.ascii_tokenizer(str(tmp_path / "tok"))
    rows = []
    for i in range(12):  # a run collapsed on 'other' (a hint naming no family), all scored high
        t = pt.sample_task(np.random.default_rng(i), "add")
        t["message"] = "guess"
        rows.append({"id": f"h{i}", "messages": [{"role": "user", "content": pt.PROMPT},
                                                 {"role": "assistant", "content": pt.task_answer(t)}],
                     "rewards": {"probe_score": 0.9}, "source": {"step": i // 4}})
    rows.append({"id": "bad", "messages": [{"role": "user", "content": pt.PROMPT},
                                           {"role": "assistant", "content": "no task"}],
                 "rewards": {"probe_score": 0.1}, "source": {"step": 2}})
    stages.write_jsonl(str(tmp_path / "history.jsonl"), rows)
    got = cmp.label_history(str(tmp_path / "history.jsonl"), str(tmp_path / "run"), tok)
    assert got == {"rows": 13, "valid": 12}
    labels = [json.loads(x) for x in open(tmp_path / "run" / "labels.jsonl")]
    assert {r["family"] for r in labels if r["valid"]} == {"other"}
    assert [r["step"] for r in labels[:4]] == [0, 0, 0, 0] and labels[0]["probe_score"] == 0.9
    orig = [{"id": f"o{i}", "trials": [True, False, False, False, False, False, False, False]}
            for i in range(3)] + [{"id": "o9", "trials": [True] * 8}]
    stages.write_jsonl(str(tmp_path / "orig.jsonl"), orig)
    stages.write_jsonl(str(tmp_path / "orig_inputs.jsonl"),
                       [{"id": r["id"], "input_ids": [1, 2], "text": "x"} for r in orig])
    out = tmp_path / "aux"
    assert main(["aux-set", "--config=configs/aux_set.py",
                 f"--config.original_labels={tmp_path / 'orig.jsonl'}",
                 f"--config.original_inputs={tmp_path / 'orig_inputs.jsonl'}",
                 f"--config.run_labels={tmp_path / 'run' / 'labels.jsonl'}",
                 f"--config.run_inputs={tmp_path / 'run' / 'inputs.jsonl'}",
                 f"--config.output={out}"]) == 0
    aux = [json.loads(x) for x in open(out / "aux_labels.jsonl")]
    assert sum(r["label"] == 1 for r in aux) == 3  # the corpus' band tasks (o9 is too easy)
    assert sum(r["source"].endswith("collapsed_family") for r in aux) == 12


def _arm(**means):
    return {k: {"mean": v, "std": 0.0, "n": 1} for k, v in means.items()}


def test_comparison_claims_follow_the_numbers():
    names = {**{"base": "b", "probe": "p", "heuristic": "h"}, **cmp.NAMES}
    s = {"probe": _arm(utility=0.35, top_share=0.9, grpo_seconds=60, solver_trials=0),
         "sil": _arm(utility=0.33, top_share=0.8, grpo_seconds=200, solver_trials=5000),
         "wco": _arm(utility=0.30, top_share=0.6), "adversarial": _arm(utility=0.2, top_share=0.5),
         "transfer_base": _arm(utility=0.1, top_share=0.3), "transfer": _arm(utility=0.2, top_share=0.9)}
    res = {"summary": s, "pool_trials": 2800}
    got = cmp.claims(res, names)
    assert [c["holds"] for c in got] == [True] * 5
    assert "2800 trials once" in got[1]["evidence"] and "1 seed(s)" in got[0]["evidence"]
    for arm, key, value, which in (("sil", "utility", 0.5, 0), ("probe", "solver_trials", 10, 1),
                                   ("probe", "grpo_seconds", 300, 1), ("wco", "top_share", 0.95, 2),
                                   ("adversarial", "top_share", 0.9, 3),
                                   ("transfer", "utility", 0.1, 4)):
        worse = {**s, arm: {**s[arm], key: {"mean": value, "std": 0.0, "n": 1}}}
        holds = [c["holds"] for c in cmp.claims({**res, "summary": worse}, names)]
        assert holds == [i != which for i in range(5)], (arm, key)
    # with seeds, a SIL lead inside the arms' mean std still counts as similar
    noisy = {**s, "sil": {**s["sil"], "utility": {"mean": 0.39, "std": 0.1, "n": 3}}}
    assert cmp.claims({**res, "summary": noisy}, names)[0]["holds"]
    # a summary without the comparison arms (README's older table) states none of them
    assert cmp.claims({"summary": {"probe": s["probe"]}}, names) == []


def test_the_table_has_the_collapse_metric_and_the_cost_columns():
    from rossjax.repro import propel

    def run(fams, **cost):
        return {"families": fams, **cost}
    runs = {"base": [run({"mul": 3, "add": 1})],
            "probe": [run({"other": 4}, grpo_seconds=50.0, solver_trials=0)],
            "heuristic": [run({"other": 3, "aff": 1}, grpo_seconds=52.0, solver_trials=0)],
            "sil": [run({"aff": 1, "other": 1}, grpo_seconds=90.0, solver_trials=640)]}
    m = dict(utility=0.2, validity=0.6, self_bleu3=0.9, distinct3=0.2)
    summary = {a: {**_arm(**m), **cmp.summary(rs)} for a, rs in runs.items()}
    headers, rows = propel.table({"runs": runs, "summary": summary})
    col = {h: i for i, h in enumerate(headers)}
    share = {r[0]: r[col["top-family share"]] for r in rows}
    assert share == {"base generator": "0.750", "GRPO, probe reward": "1.000",
                     "GRPO, heuristic": "0.750", "GRPO, solver in the loop": "0.500"}
    assert [r[col["solver trials (RL)"]] for r in rows] == ["-", "0", "0", "640"]
    assert rows[3][col["GRPO s"]] == "90" and rows[0][col["top family"]] == "mul"
