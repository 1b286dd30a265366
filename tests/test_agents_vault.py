"""The vault demo (rossjax/agents/vault.py, data/agents/vault*.jsonl): the env's verdict, its bad
inputs, the shipped warm-up data, and that agentic GRPO raises a warmed-up tiny model's reward."""

import json
import os

import numpy as np
import pytest

from rossjax.agents import ToolCall, make_env, vault
from rossjax.agents.parse import parse_tool_calls
from rossjax.curate import compile_rollout, load_tokenizer
from rossjax.curate.files import read_objects
from rossjax.errors import InputError
from rossjax.tokenizers.ascii import write_ascii_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data", "agents")


def _jsonl(name):
    return [obj for _, obj in read_objects(os.path.join(DATA, name), id_field=None)]


def test_the_code_comes_only_from_the_open_tool():
    env = make_env("vault")
    task = {"id": "v", "prompt": vault.PROMPT, "answer": "7"}
    assert env.reset(task) == [{"role": "user", "content": task["prompt"]}]
    assert not any(c.isdigit() for c in json.dumps([env.reset(task), env.tools]))
    (call,), errors = parse_tool_calls(vault.CALL, "react")
    assert not errors
    (obs,), done, verdict = env.step([call])
    assert obs.content == "7" * 8 and not done and verdict is None
    assert env.finish("7").passed and env.finish("Answer: 7").passed
    assert env.finish("8").passed is False and env.finish("").passed is False
    # a wrong tool or an argument is an observation naming it, never the code
    (bad,), _, _ = env.step([ToolCall("peek", {}, "c1")])
    assert "unknown tool 'peek'" in bad.content and "7" not in bad.content
    (arg,), _, _ = env.step([ToolCall("open", {"input": "7"}, "c2")])
    assert "open takes no arguments, got input" in arg.content
    for code in ("", "a", "12", 3, None):
        with pytest.raises(InputError, match="one digit 0-9"):
            env.reset({"id": "bad", "prompt": "p", "answer": code})


def test_shipped_tasks_and_demonstrations_are_the_generators_output():
    tasks, rows = _jsonl("vault.jsonl"), _jsonl("vault_sft.jsonl")
    assert tasks == vault.tasks(64, seed=0)
    assert rows == vault.demonstrations(600, call_share=0.5, seed=0)
    assert not {r["task"]["id"] for r in rows} & {t["id"] for t in tasks}
    opens = [len(r["messages"]) == 4 for r in rows]
    assert sum(opens) == 300  # half open the vault; the rest are the prior's lucky guesses
    env = make_env("vault")
    for r in rows:  # every row is an episode the env judges passed, replayed here
        assert env.reset(r["task"]) == r["messages"][:1]
        if len(r["messages"]) == 4:
            assert r["messages"][1]["content"] == vault.CALL
            (obs,), _, _ = env.step(parse_tool_calls(vault.CALL, "react")[0])
            assert r["messages"][2]["content"] == obs.content == r["task"]["answer"] * 8
        assert r["messages"][-1]["content"] == r["task"]["answer"]
        assert env.finish(r["messages"][-1]["content"]).passed and r["verifier"]["passed"]
    with pytest.raises(ValueError, match="call_share"):
        vault.demonstrations(2, call_share=1.5)


def test_demonstrations_curate_with_loss_on_the_assistant_turns_only(tmp_path):
    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    for r in _jsonl("vault_sft.jsonl")[:40]:
        ex = compile_rollout(r, tok)
        assert ex.status == "kept", ex
        text = tok.decode([int(t) for t, m in zip(ex.input_ids, ex.loss_mask) if m])
        want = "".join(m["content"] + "<|im_end|>" for m in r["messages"] if m["role"] == "assistant")
        assert text == want and np.asarray(ex.loss_mask).sum() < len(ex.input_ids)


def test_the_demo_config_resolves():
    from rossjax import cli
    from rossjax.train.rl import agentic_grpo

    c = cli.parse_config([f"--config={ROOT}/configs/grpo_agentic.py:runlocal,vault"])[0]
    agentic_grpo.check_config(c)  # the env name, env_kwargs and style resolve
    spec = agentic_grpo.spec_of(c)
    assert spec.make_env().name == "vault" and spec.style == "react"
    assert os.path.samefile(c.data.tasks, os.path.join(DATA, "vault.jsonl"))


def _warm_up(tmp_path, steps: int, seed: int) -> str:
    """The demo's SFT warm-up in process (what `rossjax curate` + `rossjax train` do in the
    documented recipe): the tiny preset cloned on data/agents/vault_sft.jsonl, saved as HF."""
    import jax
    import jax.numpy as jnp
    import optax

    from rossjax import models
    from rossjax.train.sft import step as sft

    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    exs = [compile_rollout(r, tok) for r in _jsonl("vault_sft.jsonl")]
    width = max(len(e.input_ids) for e in exs)
    ids, mask, seg = (np.zeros((len(exs), width), np.int32) for _ in range(3))
    for i, e in enumerate(exs):
        n = len(e.input_ids)
        ids[i, :n], mask[i, :n], seg[i, :n] = e.input_ids, e.loss_mask, 1
    pos = np.broadcast_to(np.arange(width, dtype=np.int32), ids.shape)
    cfg = models.get_preset("tiny_qwen2", vocab_size=256)
    params = models.init_params(cfg, jax.random.PRNGKey(seed))
    opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 3e-3, steps // 10, steps, 3e-4))
    state = opt.init(params)

    @jax.jit
    def step(params, state, batch):
        def loss(p):
            total, count = sft.batch_nll(cfg, p, batch, width)
            return total / jnp.maximum(count, 1.0)
        grads = jax.grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    rng = np.random.default_rng(seed)
    for _ in range(steps):
        sel = rng.choice(len(exs), 32, replace=False)
        params, state = step(params, state, {"input_ids": ids[sel], "loss_mask": mask[sel],
                                             "segment_ids": seg[sel], "positions": pos[sel]})
    out = str(tmp_path / "sft")
    models.save_hf(cfg, params, out)
    return out


@pytest.fixture
def optimized_xla():
    """XLA's full backend optimization while the test compiles: it trains 600 warm-up steps and
    8 GRPO steps, where tests/conftest.py's -O0 (cheap compiles for programs that run a few
    times) costs more than it saves, as in the repro runs (tests/repro_quick.py). The flag is
    read at each compile and is part of the compilation cache key."""
    import jax

    key = "jax_disable_most_optimizations"
    before = jax.config.values[key]
    jax.config.update(key, False)
    yield
    jax.config.update(key, before)


@pytest.mark.slow
def test_agentic_grpo_raises_the_warmed_up_reward(tmp_path, optimized_xla):
    """`:runlocal,vault` from the warm-up: over 8 steps of 32 episodes the share of episodes
    that open the vault and the env's reward both rise (docs/agents.md: opens ~0.5 -> ~0.85,
    reward ~0.6 -> ~0.8, 2 seeds; a 2-step mean of 64 episodes has a standard error of ~0.06,
    and with lr 0 the same warm-up moved -0.02 (reward) / +0.05 (opens))."""
    from rossjax import cli
    from rossjax.train.rl import grpo
    from rossjax.train.rl.history import read_history

    cfg = cli.parse_config([f"--config={ROOT}/configs/grpo_agentic.py:runlocal,vault",
                            f"--config.model.path={_warm_up(tmp_path, 600, seed=1)}"])[0]
    work = str(tmp_path / "grpo")
    grpo.run(cfg, work)
    with open(os.path.join(work, "metrics.jsonl")) as f:
        reward = [r["reward_mean"] for r in map(json.loads, f) if "reward_mean" in r]
    assert len(reward) == cfg.grpo.steps == 8
    rows = read_history(os.path.join(work, "history.jsonl"))
    assert len(rows) == 8 * 32 and all(r["verifier"]["name"] == "agents.vault" for r in rows)

    def opened(steps):
        return np.mean([r["messages"][1]["content"] == vault.CALL for r in rows
                        if r["source"]["step"] in steps])

    assert opened((6, 7)) - opened((0, 1)) > 0.15, [opened((s,)) for s in range(8)]
    assert np.mean(reward[-2:]) - np.mean(reward[:2]) > 0.1, reward
