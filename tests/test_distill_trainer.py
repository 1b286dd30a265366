"""`rossjax distill` (rossjax/train/rl/distill_trainer.py): a 2-step two-teacher LoRA run with 2
micro-batches through the CLI entry (finite KL in metrics, each row routed to its teacher, history teacher log-probs
recomputed from the teachers and the stored tokens, the history relearnable by curate), the
same run with the full-vocabulary KL (each teacher runs once a step, in the update, whose
teacher log-probs the history stores: the scoring pass's within 1e-5), the tokenizer mismatch
refused before any model loads, and the trainer's loss path against the registry's logits path
on a tiny model (value and gradient)."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax import models
from rossjax.errors import ConfigError
from rossjax.models import config as model_config
from rossjax.monitor import read_metrics
from rossjax.train.rl import distill_step, grpo_step
from rossjax.train.rl.aggregation import normalizers
from rossjax.train.rl.history import read_history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "distill_onpolicy.py")
STEPS, CONTEXTS, GROUP, NEW = 2, 4, 2, 8
TASKS = [{"id": f"t{i}", "domain": d, "prompt": f"Write the letter {c}.", "reference": c}
         for i, (d, c) in enumerate([("a", "x"), ("b", "y"), ("c", "z"), ("a", "w")])]
ROUTES = {"a": "alpha", "b": "beta"}  # domain c has no route: the default teacher, beta


def _config_file(tmp, tasks):
    """A config file over the shipped :runlocal with two tiny teachers (routes + default)."""
    path = os.path.join(tmp, "two_teachers.py")
    with open(path, "w") as f:
        f.write(f"""import importlib.util
_s = importlib.util.spec_from_file_location("distill_onpolicy", {CONFIG!r})
_m = importlib.util.module_from_spec(_s)
_s.loader.exec_module(_m)


def get_config(arg=None):
    c = _m.get_config("runlocal")
    c.data.tasks = {tasks!r}
    c.distill.teachers = {{"alpha": "preset:tiny_qwen2", "beta": "preset:tiny_qwen2"}}
    c.distill.tokenizers = {{"alpha": "", "beta": ""}}
    c.distill.routes = {ROUTES!r}
    c.distill.default = "beta"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size = {STEPS}, {CONTEXTS}, {GROUP}
    c.grpo.max_new_tokens = {NEW}
    c.grpo.micro_batches = 2
    c.lora.enabled, c.lora.rank = True, 4   # full fine-tuning: the loss-path test below
    c.reward.workers = 0
    if arg == "continued":  # the Continued control in miniature: one step past the upstream
        c.grpo.steps = {STEPS} + 1
    return c
""")
    return path


# The tests on `run` share one real 2-step CLI run (about 25 s of CPU, most of it compiling the
# sampler, teacher and update programs), so they are marked slow; the continued one resumes it.
slow_run = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The 2-step run through `rossjax distill`, and the trainer's result (teachers' params)."""
    from rossjax import cli
    from rossjax.train.rl import distill_trainer

    tmp = str(tmp_path_factory.mktemp("distill"))
    tasks = os.path.join(tmp, "tasks.jsonl")
    with open(tasks, "w") as f:
        f.writelines(json.dumps(t) + "\n" for t in TASKS)
    cfg_path, work = _config_file(tmp, tasks), os.path.join(tmp, "run")
    seen = {}
    real = distill_trainer.run
    distill_trainer.run = lambda cfg, w, **kw: seen.setdefault("out", real(cfg, w, **kw))
    try:
        rc = cli.main(["distill", f"--config={cfg_path}", f"--workdir={work}"])
    finally:
        distill_trainer.run = real
    assert rc == 0
    return work, seen["out"], tmp


@slow_run
def test_metrics_have_finite_kl(run):
    work, out, _ = run
    m = read_metrics(work)
    assert [x["step"] for x in m] == [1, 2]
    for x in m:
        for k in ("kl", "kl_sampled", "kl_sampler", "loss", "grad_norm", "kl_alpha", "kl_beta"):
            assert math.isfinite(x[k]), (k, x)
        assert x["grad_norm"] > 0 and x["skipped"] == 0
    # step 1 is on-policy: the update's own log-probs are the sampler's (same weights)
    assert abs(m[0]["kl_sampled"] - m[0]["kl_sampler"]) < 1e-4


def _teacher_logprobs(out, rows):
    """name -> [row][k]: each teacher's log-prob of every row's completion tokens, from one
    plain forward over the stored token ids (right-padded; causal, so padding changes nothing)."""
    width = max(len(r["token_ids"]) for r in rows)
    tok = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        tok[i, :len(r["token_ids"])] = r["token_ids"]
    got = {}
    for name, (tcfg, _, params) in out["run"].teachers.items():
        logits = jax.jit(lambda p, t, c=tcfg: models.forward(c, p, t)[0])(params, tok)
        lp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)  # T = 1 in :runlocal
        got[name] = []
        for i, r in enumerate(rows):
            p0, ids = r["source"]["prompt_tokens"], r["token_ids"]
            got[name].append(np.asarray([lp[i, p0 - 1 + k, ids[p0 + k]]
                                         for k in range(len(r["logprobs"]))]))
    return got


@slow_run
def test_history_routes_and_teacher_logprobs(run):
    work, out, _ = run
    rows = read_history(os.path.join(work, "history.jsonl"))
    assert len(rows) == STEPS * CONTEXTS * GROUP
    recomputed = _teacher_logprobs(out, rows)
    for i, r in enumerate(rows):
        want = ROUTES.get(r["task"]["domain"], "beta")
        assert r["teacher"] == want, (r["task"], r["teacher"])
        p0, n = r["source"]["prompt_tokens"], len(r["logprobs"])
        assert len(r["teacher_logprobs"]) == n and p0 + n <= len(r["token_ids"])
        mine = recomputed[want][i]
        np.testing.assert_allclose(r["teacher_logprobs"], mine, atol=2e-4)
        other = recomputed["alpha" if want == "beta" else "beta"][i]
        assert np.abs(mine - other).max() > 1e-3  # the two teachers do differ
        assert r["distill"]["loss"] == "reverse_kl_sampled"
        k1 = sum(a - b for a, b in zip(r["logprobs"], r["teacher_logprobs"]))
        assert abs(r["distill"]["kl_sampled_sum"] - k1) < 1e-3
    assert {r["teacher"] for r in rows} == {"alpha", "beta"}


@slow_run
def test_history_relearns_in_curate(run):
    from rossjax import cli

    work, _, tmp = run
    dst = os.path.join(tmp, "curated")
    rc = cli.main(["curate", "--config=configs/curate.py", f"--config.input={work}/history.jsonl",
                   f"--config.tokenizer={work}/tokenizer", f"--config.output={dst}",
                   "--config.rows=verifier_positive", "--config.mask_mode=eligible",
                   "--config.progress=False"])
    assert rc == 0
    rep = json.load(open(os.path.join(dst, "report.json")))
    assert rep["input_rows"] == STEPS * CONTEXTS * GROUP and rep["buckets"]["invalid"] == 0


@slow_run
def test_continued_resumes_the_last_checkpoint(run):
    """`:continued`'s mechanism: a copy of the finished upstream workdir, rerun with a longer
    grpo.steps, restores its last checkpoint and runs only the extra steps."""
    import shutil

    from rossjax import cli

    work, _, tmp = run
    cont = os.path.join(tmp, "continued")
    shutil.copytree(work, cont)
    cfg_path = os.path.join(tmp, "two_teachers.py")
    assert cli.main(["distill", f"--config={cfg_path}:continued", f"--workdir={cont}"]) == 0
    assert [x["step"] for x in read_metrics(cont)] == [1, 2, 3]
    rows = read_history(os.path.join(cont, "history.jsonl"))
    assert len(rows) == (STEPS + 1) * CONTEXTS * GROUP and rows[-1]["source"]["step"] == STEPS
    assert rows[:STEPS * CONTEXTS * GROUP] == read_history(os.path.join(work, "history.jsonl"))


def test_mismatched_tokenizer_refused_before_loading(tmp_path, monkeypatch):
    from rossjax.cli.flags import parse_config
    from rossjax.train.rl import distill_setup, distill_trainer

    cfg = parse_config([f"--config={CONFIG}:runlocal"])[0]
    cfg.distill.tokenizers.contains = "qwen"
    monkeypatch.setattr(distill_setup.DistillRun, "__init__",
                        lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError, match=r"^teacher 'contains \(preset:tiny_qwen2\)' cannot "
                       r"distill .*151669 tokens against the student's 131, and per-token KL "
                       r"needs the same tokenizer\.$"):
        distill_trainer.run(cfg, str(tmp_path / "w"))


def test_unrouted_task_refused_before_loading(tmp_path, monkeypatch):
    from rossjax.cli.flags import parse_config
    from rossjax.errors import InputError
    from rossjax.train.rl import distill_setup, distill_trainer

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    cfg = parse_config([f"--config={CONFIG}:runlocal", f"--config.data.tasks={tasks}"])[0]
    monkeypatch.setattr(distill_setup.DistillRun, "__init__",
                        lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(InputError, match=r"tasks.jsonl row 0: field 'domain' = 'a' names no "
                       r"teacher \(routes: contains\)\.$"):
        distill_trainer.run(cfg, str(tmp_path / "w"))


def test_config_variants():
    from rossjax.cli.flags import parse_config

    base = parse_config([f"--config={CONFIG}"])[0]
    assert base.grpo.steps == 500 and base.distill.loss == "reverse_kl_sampled"
    assert parse_config([f"--config={CONFIG}:continued"])[0].grpo.steps == 700
    local = parse_config([f"--config={CONFIG}:runlocal,continued"])[0]
    assert local.grpo.steps == 30 and local.distill.teachers.contains == "preset:tiny_qwen2"


def _tiny(seed):
    cfg = model_config.get_preset("tiny_qwen2", vocab_size=64, dtype="float32",
                                   param_dtype="float32")
    return cfg, models.init_params(cfg, jax.random.PRNGKey(seed))


@pytest.fixture(scope="module")
def tiny_two():
    """Tiny student and two teachers, 4 rows routed 0 1 1 0, the scoring pass's log-probs."""
    scfg, sp = _tiny(0)
    (tcfg, tp0), (_, tp1) = _tiny(1), _tiny(2)
    r = np.random.default_rng(0)
    b, s = 4, 10
    tok = r.integers(0, 64, (b, s)).astype(np.int32)
    batch = {"tokens": tok, "positions": np.tile(np.arange(s, dtype=np.int32), (b, 1)),
             "segment_ids": np.ones((b, s), np.int32),
             "targets": np.concatenate([tok[:, 1:], np.zeros((b, 1), np.int32)], 1),
             "mask": (np.arange(s)[None] >= 4).astype(np.int32) * (np.arange(s)[None] < s - 1),
             "teacher_idx": np.asarray([0, 1, 1, 0], np.int32)}
    temp = 0.7
    teacher = jax.jit(lambda p: grpo_step.token_logprobs(tcfg, p, batch, 16, False, temp))
    tl = [np.asarray(teacher(p)) for p in (tp0, tp1)]
    batch["teacher_logp"] = np.where(batch["teacher_idx"][:, None] == 0, tl[0], tl[1])
    norm = normalizers(batch["mask"], "token_mean")

    def value_grad(loss, grad=True):
        fn = distill_step.make_loss_fn(scfg, [tcfg, tcfg], loss=loss, agg="token_mean",
                                       temperature=temp, chunk=16, lora_alpha=None)
        f = lambda p: fn(p, {}, (tp0, tp1), norm, batch)[0]  # noqa: E731
        return jax.jit(jax.value_and_grad(f) if grad else lambda p: (f(p), None))(sp)

    return scfg, sp, tcfg, tp0, tp1, tok, batch, temp, norm, value_grad


def test_trainer_loss_paths_agree_with_the_registry(tiny_two):
    """The trainer's loss on tiny models against numpy from plain forwards: the sampled loss
    (chunked head, stored teacher log-probs; its gradient form is test_distill_losses') and the
    full KL, which runs the teachers inside the update and takes each row's own teacher."""
    scfg, sp, tcfg, tp0, tp1, tok, batch, temp, norm, value_grad = tiny_two
    v_tok, g_tok = value_grad("reverse_kl_sampled")            # TOKEN_FORMS path
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g_tok)) > 1e-4
    v_full, _ = value_grad("reverse_kl_full", grad=False)       # full logits, in-update teachers
    fwd = jax.jit(lambda p: models.forward(scfg, p, tok)[0])  # the three share one shape
    ls, lt0, lt1 = (np.asarray(fwd(p), np.float64) / temp for p in (sp, tp0, tp1))
    ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
    lt = [x - np.log(np.exp(x).sum(-1, keepdims=True)) for x in (lt0, lt1)]
    lt = np.where(batch["teacher_idx"][:, None, None] == 0, lt[0], lt[1])
    m, y = batch["mask"], batch["targets"][..., None]
    k1 = np.take_along_axis(ls, y, -1)[..., 0] - np.take_along_axis(lt, y, -1)[..., 0]
    assert abs(float(v_tok) - (k1 * m).sum() / m.sum()) < 1e-5
    kl = (np.exp(ls) * (ls - lt)).sum(-1)
    want = (kl * m).sum() / m.sum()
    assert abs(float(v_full) - want) < 1e-5


# -- the full-vocabulary loss: the update is the teachers' only pass --------------------------

@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The same 2-step two-teacher run with reverse_kl_full, counting every teacher forward
    (a debug callback in distill_step.teacher_forward: it fires when the forward runs, inside
    the update's scan and lax.cond) and every call of the separate scoring pass."""
    from rossjax import cli
    from rossjax.train.rl import distill_trainer

    tmp = str(tmp_path_factory.mktemp("distill_full"))
    tasks = os.path.join(tmp, "tasks.jsonl")
    with open(tasks, "w") as f:
        f.writelines(json.dumps(t) + "\n" for t in TASKS)
    cfg_path, work = _config_file(tmp, tasks), os.path.join(tmp, "run")
    calls, marks, scoring, seen = [], [], [], {}
    fwd, upd, score = (distill_step.teacher_forward, distill_step.DistillFns.update,
                       distill_step.DistillFns.teacher_logp)

    def counted(tcfg, params, mb):
        first = jax.tree.leaves(params)[0]
        jax.debug.callback(lambda fp, idx: calls.append((float(fp), np.asarray(idx))),
                           jnp.sum(first.astype(jnp.float32)), mb["teacher_idx"])
        return fwd(tcfg, params, mb)

    def update(self, *a, **k):
        out = upd(self, *a, **k)
        jax.effects_barrier()
        marks.append(len(calls))
        return out

    real = distill_trainer.run
    distill_trainer.run = lambda cfg, w, **kw: seen.setdefault("out", real(cfg, w, **kw))
    distill_step.teacher_forward = counted
    distill_step.DistillFns.update = update
    distill_step.DistillFns.teacher_logp = lambda *a, **k: scoring.append(1) or score(*a, **k)
    try:
        rc = cli.main(["distill", f"--config={cfg_path}", f"--workdir={work}",
                       "--config.distill.loss=reverse_kl_full"])
    finally:
        distill_trainer.run = real
        distill_step.teacher_forward = fwd
        distill_step.DistillFns.update, distill_step.DistillFns.teacher_logp = upd, score
    assert rc == 0
    return work, seen["out"], calls, marks, scoring


@slow_run
def test_full_kl_runs_each_teacher_once_a_step(full_run):
    """Per step: no separate scoring pass, and the update runs a teacher only on a micro-batch
    holding its rows. The step's rows come in grouped by teacher, so with this run's 4 + 4 rows
    in micro-batches of 4, each teacher runs exactly once a step, over its own rows."""
    work, out, calls, marks, scoring = full_run
    assert scoring == [] and marks == [2, 4], (scoring, marks)
    rows = read_history(os.path.join(work, "history.jsonl"))
    order = list(out["run"].teachers)
    fps = np.asarray([float(jnp.sum(jax.tree.leaves(p)[0].astype(jnp.float32)))
                      for _, _, p in out["run"].teachers.values()])
    assert abs(fps[0] - fps[1]) > 1e-2 and order == ["alpha", "beta"]

    def which(fp):  # the teacher whose parameters the forward ran with
        k = int(np.argmin(np.abs(fps - fp)))
        assert abs(fps[k] - fp) < 1e-3
        return k
    for step in range(STEPS):
        names = [r["teacher"] for r in rows if r["source"]["step"] == step]
        assert sorted(names) == ["alpha"] * 4 + ["beta"] * 4
        mine = calls[2 * step:2 * step + 2]
        ran = sorted(which(fp) for fp, _ in mine)
        assert ran == [0, 1]  # each teacher once
        for fp, idx in mine:  # on a micro-batch of its own rows only
            assert idx.shape == (4,) and (idx == which(fp)).all(), (fp, idx)
    m = read_metrics(work)
    assert all(math.isfinite(x["loss"]) and x["grad_norm"] > 0 for x in m)
    # step 1 is on-policy: the update's own log-probs are the sampler's (same weights)
    assert abs(m[0]["kl_sampled"] - m[0]["kl_sampler"]) < 1e-4


@slow_run
def test_full_kl_history_matches_the_scoring_pass(full_run):
    """The history's teacher_logprobs (from the update's teacher pass) against the separate
    scoring pass the sampled-token loss runs (DistillFns.teacher_logp, the chunked LM head),
    on the stored tokens: within 1e-5."""
    work, out, *_ = full_run
    run = out["run"]
    rows = read_history(os.path.join(work, "history.jsonl"))
    assert {r["distill"]["loss"] for r in rows} == {"reverse_kl_full"}
    width = max(len(r["token_ids"]) for r in rows)
    for name in run.teachers:
        mine = [r for r in rows if r["teacher"] == name]
        host = {k: np.zeros((len(mine), width), np.int32) for k in grpo_step.BATCH_KEYS}
        for i, r in enumerate(mine):
            ids = r["token_ids"]
            host["tokens"][i, :len(ids)] = ids
            host["targets"][i, :len(ids) - 1] = ids[1:]
            host["positions"][i] = np.arange(width)
            host["segment_ids"][i, :len(ids)] = 1
        lp = run.fns.teacher_logp(name, run.teachers[name][2], host)
        for i, r in enumerate(mine):
            p0, n = r["source"]["prompt_tokens"] - 1, len(r["logprobs"])
            np.testing.assert_allclose(r["teacher_logprobs"], lp[i, p0:p0 + n], atol=1e-5,
                                       rtol=0)
            k1 = sum(a - b for a, b in zip(r["logprobs"], r["teacher_logprobs"]))
            assert abs(r["distill"]["kl_sampled_sum"] - k1) < 1e-3


def test_group_order_and_merge_micro():
    """group_order fills whole micro-batches with one teacher's rows under split_micro's
    strided split, and merge_micro undoes split_micro."""
    from rossjax.train import accumulate

    idx = np.asarray([1, 0, 2, 1, 0, 0, 2, 1, 1, 0, 2, 2], np.int32)
    order = distill_step.group_order(idx, 3)
    assert sorted(order) == list(range(12))
    micro = np.asarray(accumulate.split_micro(jnp.asarray(idx[order]), 3))
    assert [sorted(set(x)) for x in micro] == [[0], [1], [2]]
    x = jnp.arange(24).reshape(12, 2)
    np.testing.assert_array_equal(distill_step.merge_micro(accumulate.split_micro(x, 4)), x)


def test_update_teacher_pass_is_the_loss_own(tiny_two):
    """The update's way for the full KL: the teachers' pass runs outside the gradient and is
    handed to the loss (make_teacher_fn); the same loss as the loss running the teachers itself
    (the same function of them: its gradient is test_distill_parity's), and its sampled-token
    log-probs are the scoring pass's (chunked head) within 1e-5."""
    scfg, sp, tcfg, tp0, tp1, tok, batch, temp, norm, value_grad = tiny_two
    v_full, _ = value_grad("reverse_kl_full", grad=False)
    (t_logits, t_lp), t_lp_masked = jax.jit(distill_step.make_teacher_fn([tcfg, tcfg], temp))(
        (tp0, tp1), batch)
    fn = distill_step.make_loss_fn(scfg, [tcfg, tcfg], loss="reverse_kl_full", agg="token_mean",
                                   temperature=temp, chunk=16, lora_alpha=None)
    v_pre = jax.jit(lambda p: fn(p, {}, (), norm, batch, (t_logits, t_lp))[0])(sp)
    # The same function, fused two ways: equal to float32 rounding (a few ulps; on an Intel Xeon
    # with AMX the two differ by 5e-7 relative, so an absolute 1e-7 failed there).
    np.testing.assert_allclose(float(v_pre), float(v_full), rtol=1e-6, atol=0)
    assert float(v_full) > 1e-3
    np.testing.assert_allclose(np.asarray(t_lp_masked), batch["teacher_logp"] * batch["mask"],
                               atol=1e-5, rtol=0)
