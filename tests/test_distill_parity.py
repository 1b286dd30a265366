"""Issue 41 item 2: one distillation step's loss and gradients against the equivalent torch
computation on the same tiny Hugging Face models and batch, within 1e-4 (fp32, CPU).

Settings: a Qwen2 student and teacher (hf_tiny: vocab 256, d 64, 2 layers, seeds 0 and 1), 3
rows of 12 tokens, completion mask from position 4 (one row shorter), temperature 0.8,
aggregation token_mean. The full-vocabulary loss is TRL GKDTrainer's generalized JSD at
beta = 1 (its reverse-KL end), lmbda = 1 (on-policy samples), with the labels' mask: the sum
over completion tokens of KL(pi_s || pi_t) at softmax(logits / T), over their count. TRL
itself is not installed here, so the torch side is written out (F.kl_div in its log-target
form, as GKD computes that term). The sampled-token loss is the score-function form:
sum sg(log pi_s(y) - log pi_t(y)) * log pi_s(y) over the tokens, over their count.
Gradients come back to rossjax's layout by saving the torch gradients as an HF folder and
reading it with load_hf (the weight mapping is linear)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
F = torch.nn.functional

from hf_tiny import make_tiny_hf  # noqa: E402

from rossjax.models import load_hf  # noqa: E402
from rossjax.train.rl import distill_step, grpo_step  # noqa: E402
from rossjax.train.rl.aggregation import normalizers  # noqa: E402

TOL, TEMP, B, S = 1e-4, 0.8, 3, 12


def _batch():
    r = np.random.default_rng(0)
    tok = r.integers(0, 256, (B, S)).astype(np.int32)
    mask = np.zeros((B, S), np.int32)
    mask[:, 4:S - 1] = 1
    mask[2, 8:] = 0
    return {"tokens": tok, "positions": np.tile(np.arange(S, dtype=np.int32), (B, 1)),
            "segment_ids": np.ones((B, S), np.int32),
            "targets": np.concatenate([tok[:, 1:], np.zeros((B, 1), np.int32)], 1),
            "mask": mask, "teacher_idx": np.zeros(B, np.int32)}


def _torch_step(student, teacher, batch, loss, path):
    """(loss value, the gradient tree in rossjax's layout)."""
    student.zero_grad()
    tok = torch.tensor(batch["tokens"], dtype=torch.long)
    m = torch.tensor(batch["mask"], dtype=torch.float32)
    y = torch.tensor(batch["targets"], dtype=torch.long)[..., None]
    ls = F.log_softmax(student(tok).logits / TEMP, -1)
    with torch.no_grad():
        lt = F.log_softmax(teacher(tok).logits / TEMP, -1)
    if loss == "reverse_kl_full":  # GKD, beta = 1: kl_div(input=log pi_t, target=log pi_s)
        per = F.kl_div(lt, ls, reduction="none", log_target=True).sum(-1)
        value = (per * m).sum() / m.sum()
        value.backward()
    else:
        lps, lpt = ls.gather(-1, y)[..., 0], lt.gather(-1, y)[..., 0]
        k1 = (lps - lpt).detach()
        value = ((k1 * m).sum() / m.sum())
        ((k1 * lps * m).sum() / m.sum()).backward()
    with torch.no_grad():
        for p in student.parameters():
            p.copy_(p.grad)
    student.save_pretrained(str(path))
    return float(value), load_hf(path)[1]


@pytest.mark.parametrize("loss", ["reverse_kl_full", "reverse_kl_sampled"])
def test_step_matches_torch(loss, tmp_path):
    student = make_tiny_hf("qwen2", tmp_path / "s", seed=0)
    teacher = make_tiny_hf("qwen2", tmp_path / "t", seed=1)
    cfg, sp = load_hf(tmp_path / "s")
    tcfg, tp = load_hf(tmp_path / "t")
    batch = _batch()
    tl = grpo_step.token_logprobs(tcfg, tp, batch, 64, False, TEMP)
    batch["teacher_logp"] = np.asarray(tl)
    fn = distill_step.make_loss_fn(cfg, [tcfg], loss=loss, agg="token_mean", temperature=TEMP,
                                   chunk=64, lora_alpha=None)
    norm = normalizers(batch["mask"], "token_mean")
    value, grads = jax.jit(jax.value_and_grad(lambda p: fn(p, {}, (tp,), norm, batch)[0]))(sp)
    want, want_g = _torch_step(student, teacher, batch, loss, tmp_path / "g")
    assert abs(float(value) - want) < TOL, (float(value), want)
    assert abs(want) > 1e-3  # the two models differ: a loss to match
    flat, ref = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(want_g)
    assert len(flat) == len(ref)
    for (where, a), b in zip(flat, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=TOL, rtol=0,
                                   err_msg=jax.tree_util.keystr(where))
    assert max(float(np.abs(np.asarray(b)).max()) for b in ref) > 1e-3
