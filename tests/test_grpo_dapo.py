"""DAPO in `rossjax grpo`: the soft overlong penalty and the uniform-group test against loop
formulas, dynamic sampling's batch assembly (kept, filler, every record kept), and both through
real runs on a tiny model with scripted rewards."""

import dataclasses

import numpy as np
import pytest

from rossjax import sample as sample_lib
from rossjax.errors import ConfigError
from rossjax.train.rl import advantages


def test_overlong_penalty_and_uniform_groups():
    L, cache = 20, 6
    lengths = np.arange(0, 24)
    got = advantages.overlong_penalty(lengths, L, cache, factor=0.5)
    for n, v in zip(lengths, got):
        if n <= L - cache:
            want = 0.0
        elif n <= L:
            want = ((L - cache) - n) / cache
        else:
            want = -1.0
        assert v == pytest.approx(0.5 * want, abs=1e-12), n
    assert got[L] == -0.5 and got[L - cache] == 0.0
    r = np.array([1, 1, 1,  0, 1, 0,  np.nan, 2, 2,  np.nan, np.nan, 5,  np.nan, 0, 1])
    assert advantages.uniform_groups(r, 3).tolist() == [True, False, True, True, False]



def test_dynamic_sampling_needs_synchronous_sampling():
    from rossjax.train.rl import grpo_config

    c = grpo_config.default_config()
    c.reward.functions = ("contains",)
    c.grpo.dynamic_sampling = c.grpo.async_sampling = True
    with pytest.raises(ConfigError, match="dynamic_sampling needs config.grpo.async_sampling=False"):
        grpo_config.check_config(c)



@dataclasses.dataclass
class _FakeScored:   # the fields grpo.GRPOTrainer's scored batch has
    sampled: dict
    cpu_scores: list
    reward: np.ndarray
    rewards: dict
    update_rows: dict
    entropy: np.ndarray
    is_metrics: dict


def _round(rewards, width, tag):
    n = len(rewards)
    recs = [{"id": f"{tag}{i}", "source": {}} for i in range(n)]
    arr = lambda v: np.full((n, width), v, np.float32)
    gen = sample_lib.GenerationResult(tokens=np.arange(n)[:, None] + np.zeros((n, 3), int),
                                      logprobs=np.zeros((n, 3), np.float32),
                                      lengths=np.full(n, 3), finish_reason=["stop"] * n)
    batch = {"mask": np.ones((n, width), np.int32), "sampler_logp": arr(-1.0)}
    full = {"mask": batch["mask"], "old_logp": np.arange(n * width, dtype=np.float32)
            .reshape(n, width), "adv": np.arange(n, dtype=np.float32)}
    return _FakeScored({"tasks": list(range(n // 2)), "records": recs, "batch": batch,
                        "gen": gen, "sample_s": 1.0}, [{"r": i} for i in range(n)],
                       np.asarray(rewards, np.float64), {"x": np.asarray(rewards) * 10},
                       full, arr(0.5), {})


def test_dynamic_sampling_assembles_kept_then_filler_and_keeps_every_record():
    from rossjax.train.rl import dynamic_sampling

    G = 2
    r0 = _round([1, 1, 0, 1, 2, 2], width=4, tag="a")   # groups: uniform, informative, uniform
    r1 = _round([0, 1, 3, 3], width=6, tag="b")          # informative, uniform
    out, m = dynamic_sampling.assemble([r0, r1], 3, G)
    # kept a1, b0; then one filler (the first uniform, a0); the rest dropped
    assert [r["id"] for r in out.sampled["records"]] == ["a2", "a3", "b0", "b1", "a0", "a1",
                                                    "a4", "a5", "b2", "b3"]
    assert [r["source"]["dynamic_sampling"] for r in out.sampled["records"][::2]] == [
        "kept", "kept", "filler_masked", "dropped_uniform", "dropped_uniform"]
    assert m == {"dynamic_refill_rounds": 1, "dynamic_groups_sampled": 5,
                 "dynamic_groups_uniform": 3, "dynamic_groups_filler": 1}
    f = out.update_rows
    assert f["mask"].shape == (6, 6)                        # padded to the widest round
    np.testing.assert_array_equal(f["mask"][:, :4].sum(1), [4, 4, 4, 4, 0, 0])  # filler masked
    assert f["mask"][:2, 4:].sum() == 0 and f["mask"][2:4, 4:].sum() == 4
    np.testing.assert_array_equal(f["adv"], [2, 3, 0, 1, 0, 1])
    np.testing.assert_array_equal(f["old_logp"][0, :4], [8, 9, 10, 11])
    np.testing.assert_array_equal(out.sampled["batch"]["mask"], f["mask"])
    np.testing.assert_array_equal(out.reward, [0, 1, 0, 1, 1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(out.rewards["x"], out.reward * 10)
    assert [c["r"] for c in out.cpu_scores] == [2, 3, 0, 1, 0, 1, 4, 5, 2, 3]
    assert out.sampled["gen"].tokens[:, 0].tolist() == [2, 3, 0, 1, 0, 1]
    assert out.sampled["sample_s"] == 2.0 and out.entropy.shape == (6, 6)


def scripted_rewards(kinds, records):
    """contains-i with i even: every candidate 0.5 (a uniform group); odd: the sample index."""
    out = []
    for r in records:
        i = int(r["task"]["id"].rsplit("-", 1)[1])
        out.append({k: (0.5 if i % 2 == 0 else float(r["source"]["sample"]), None) for k in kinds})
    return out


def _tiny_run_config(steps=2, contexts=4, group=4, new=8):
    from rossjax.train.rl import grpo_config

    c = grpo_config.default_config()
    c.tokenizer, c.model.preset, c.model.dtype = "ascii", "tiny_qwen2", "float32"
    c.data.tasks = "gen:contains"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size, c.grpo.max_new_tokens = steps, contexts, group, new
    c.grpo.loss_chunk = 32
    c.reward.functions, c.reward.workers = ("contains",), 0
    c.optim.peak_lr = c.optim.end_lr = 3e-3
    c.mesh.num_devices = 1
    c.checkpoint.async_save, c.checkpoint.save_every = False, 1000
    return c


@pytest.mark.parametrize("rounds", [3, 0])
def test_dynamic_sampling_through_grpo(tmp_path, rounds):
    from rossjax.monitor import read_metrics
    from rossjax.train.rl import grpo
    from rossjax.train.rl.history import read_history

    c = _tiny_run_config(contexts=2, group=2)
    c.grpo.dynamic_sampling, c.grpo.max_refill_rounds = True, rounds
    grpo.run(c, str(tmp_path), cpu_scorer=scripted_rewards)
    m = read_metrics(str(tmp_path))
    rows = read_history(str(tmp_path / "history.jsonl"))
    labels = [r["source"]["dynamic_sampling"] for r in rows]
    if rounds:   # 1 informative group a round: one refill round fills the 2
        assert [x["dynamic_refill_rounds"] for x in m] == [1, 1]
        assert [x["dynamic_groups_sampled"] for x in m] == [4, 4]
        assert [x["dynamic_groups_filler"] for x in m] == [0, 0]
        assert len(rows) == 2 * 4 * 2
        assert labels == (["kept"] * 4 + ["dropped_uniform"] * 4) * 2
        ids = [r["task"]["id"] for r in rows[::2]]   # every task drawn once, none lost
        assert sorted(ids, key=lambda s: int(s.split("-")[1])) == [f"contains-{i}" for i in range(8)]
    else:        # no refill: the uniform group stays, masked out
        assert [x["dynamic_refill_rounds"] for x in m] == [0, 0]
        assert [x["dynamic_groups_filler"] for x in m] == [1, 1]
        assert labels == (["kept"] * 2 + ["filler_masked"] * 2) * 2
    for r in rows:
        i = int(r["task"]["id"].rsplit("-", 1)[1])
        assert (r["source"]["dynamic_sampling"] == "kept") == (i % 2 == 1)
    assert all(x["grad_norm"] > 0 and np.isfinite(x["loss"]) for x in m)
    assert [x["zero_var_group_frac"] for x in m] == [0.5, 0.5]   # over every sampled group


def test_overlong_penalty_through_grpo(tmp_path):
    """DAPO's soft penalty in every record's reward, with GSPO, the unbiased KL and T = 0.8."""
    from rossjax.train.rl import grpo
    from rossjax.train.rl.history import read_history

    c = _tiny_run_config(steps=1, contexts=2, new=6)
    c.grpo.overlong_buffer, c.grpo.overlong_penalty = 3, 0.5
    c.grpo.policy_loss, c.grpo.kl, c.grpo.beta, c.grpo.temperature = "gspo", "k3_unbiased", 0.1, 0.8
    grpo.run(c, str(tmp_path / "penalty"), cpu_scorer=scripted_rewards)
    rows = read_history(str(tmp_path / "penalty" / "history.jsonl"))
    for r in rows:
        n = 6 if r["source"]["finish_reason"] == "length" else \
            len(r["token_ids"]) - r["source"]["prompt_tokens"]
        want = 0.5 * min(max(-(n - 3) / 3, -1.0), 0.0)
        assert r["rewards"]["overlong"] == pytest.approx(want, abs=1e-12)
        assert r["reward"] == pytest.approx(r["rewards"]["contains"] + want, abs=1e-12)
    assert any(r["rewards"]["overlong"] < 0 for r in rows)


@pytest.mark.slow
def test_overlong_filter_through_grpo(tmp_path):
    """A batch of truncated completions gives no loss and no gradient once filtered."""
    from rossjax.monitor import read_metrics
    from rossjax.train.rl import grpo

    c = _tiny_run_config(steps=1, contexts=2, new=2)
    c.grpo.overlong_filter = True
    grpo.run(c, str(tmp_path / "filter"), cpu_scorer=scripted_rewards)
    m = read_metrics(str(tmp_path / "filter"))[-1]
    assert m["truncated_frac"] == 1.0 and m["reward_std"] > 0
    assert m["loss"] == 0.0 and m["grad_norm"] == 0.0
    c.grpo.overlong_filter = False   # the same batch, unfiltered, does learn
    grpo.run(c, str(tmp_path / "nofilter"), cpu_scorer=scripted_rewards)
    assert read_metrics(str(tmp_path / "nofilter"))[-1]["grad_norm"] > 0


def test_the_banner_names_rewards_and_where_they_run():
    import ml_collections

    from rossjax.train.rl.grpo import reward_words

    r = ml_collections.ConfigDict({"functions": ("env",), "workers": 0})
    assert reward_words(r) == "reward env (judged by the environment during each episode)"
    r.functions, r.workers = ("math", "format"), 2
    assert reward_words(r) == "rewards math, format on 2 reward processes"
    r.workers = 0
    assert reward_words(r) == "rewards math, format in this process (reward.workers 0)"
