"""Multi-turn agent rollouts on the engine (rossjax/train/rl/agentic.py) and agentic GRPO
(rossjax/train/rl/agentic_grpo.py): exact tokens and log-probs, malformed calls, a step that times
out, SIGKILL + resume, GRPO -> curate -> train through the CLI, 2 processes = 1 process.

A random tiny model never writes a tool call, so the episodes here use `two_calls`, a
module:function tool-call parser that reads every reply as a call of `echo` for the first two
turns (then as an answer): the engine, the observation rendering and the records are the real
ones. `EchoEnv`'s verdict is the parity of the final reply's bytes, so about half pass. Both live
in tests/agentic_echo.py, which imports no jax: every episode's env worker process imports it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from agentic_echo import EchoEnv
from xla_flags import xla_flags

from rossjax import models
from rossjax.agents import ToolCall
from rossjax.agents.env import LocalEnv
from rossjax.curate import compile_rollout
from rossjax.tokenizers import load_tokenizer
from rossjax.tokenizers.ascii import write_ascii_tokenizer
from rossjax.train.rl import agentic, agentic_grpo, grpo_step
from rossjax.train.rl.history import read_history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path_factory.mktemp("tok"))))
    cfg = models.get_preset("tiny_qwen2", vocab_size=tok.vocab_size)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    return cfg, params, tok


TASKS = [{"id": "t0", "prompt": "Say hi."}, {"id": "t1", "prompt": "Count to 3."}]


def _spec(**kw):
    base = dict(env="agentic_echo:EchoEnv", style="agentic_echo:two_calls",
                max_turns=3, max_tokens=512, max_new_tokens=8, tools_in_prompt=False)
    return agentic.AgentSpec(**{**base, **kw})


def test_multi_turn_logprobs_equal_a_forward_over_the_stored_ids(tiny):
    cfg, params, tok = tiny
    temp = 0.8
    trajs = agentic.rollouts(cfg, params, tok, TASKS, _spec(), group=2, temperature=temp, seed=3)
    assert [t.turns for t in trajs] == [3] * 4 and all(t.stop == "answered" for t in trajs)
    for t in trajs:
        roles = [m["role"] for m in t.messages]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        # policy tokens: exactly what the engine sampled, 3 turns; observation tokens between
        runs = agentic_grpo._runs(t.policy)
        assert len(runs) == 3 and t.policy_tokens == sum(b - a for a, b in runs)
        assert "<tool_response>" in tok.decode(t.ids[runs[0][1]:runs[1][0]])
        # the stored ids spell the template's rendering of the stored messages (curate agrees)
        rec = agentic_grpo.make_record(t, run="r", step=0, style="x")
        rec["verifier"] = {"name": "echo", "passed": True, "evidence": ""}
        ex = compile_rollout(rec, tok, mask_mode="eligible")
        assert ex.status == "kept", ex.detail
        assert ex.input_ids.tolist() == rec["token_ids"]
        pol = np.asarray(t.policy)
        assert ex.eligible_mask[pol].all()  # every sampled token is an assistant token
        assert [s[0] for s in t.spans] == list(range(6))
        for i, a, b in t.spans:
            if t.messages[i]["role"] == "assistant":  # sampled, but for the end marker the
                assert pol[a:b - 1].all()             # template adds after a truncated turn
                assert pol[b - 1] or t.ids[b - 1] == tok.eos_id
            else:
                assert not pol[a:b].any()
    batch = agentic_grpo.trajectory_batch(trajs, 512)
    lp = np.asarray(grpo_step.token_logprobs(cfg, params, {k: batch[k] for k in grpo_step.BATCH_KEYS},
                                             64, temperature=temp))
    m = batch["mask"].astype(bool)
    assert m.sum() == sum(t.policy_tokens for t in trajs)
    # fp32 end to end: the engine's cached decode and a straight forward agree to rounding
    np.testing.assert_allclose(lp[m], batch["sampler_logp"][m], atol=1e-4)
    assert np.all(batch["sampler_logp"][~m] == 0)


def test_update_rows_train_the_sampled_turns_with_their_group_advantage(tiny):
    """The loss mask of a multi-turn row covers exactly the policy's turns (each turn's sampled
    text and its end-of-turn token; not the prompt, the observations or the headers), and each
    row's advantage is its own verdict against its own task's group (rows i*G+j)."""
    from rossjax.train.rl import advantages

    cfg, params, tok = tiny
    g = 4
    trajs = agentic.rollouts(cfg, params, tok, TASKS, _spec(), group=g, temperature=1.0, seed=5)
    assert [t.task["id"] for t in trajs] == [t["id"] for t in TASKS for _ in range(g)]
    assert [t.sample for t in trajs] == list(range(g)) * len(TASKS)
    batch = agentic_grpo.trajectory_batch(trajs, 512)
    for r, t in enumerate(trajs):
        # raw text (two_calls keeps every turn raw), + the end-of-turn token unless the turn
        # used its whole budget (spec max_new_tokens 8: truncated, no end token sampled)
        want = [ids + [tok.eos_id] * (len(ids) < 8) for ids in
                (tok.encode(m["content"]) for m in t.messages if m["role"] == "assistant")]
        got = batch["targets"][r][batch["mask"][r].astype(bool)].tolist()
        assert got == [x for turn in want for x in turn]
        assert not batch["mask"][r, :t.n_prompt - 1].any()
    records = [agentic_grpo.make_record(t, run="r", step=0, style="x") for t in trajs]
    reward = np.asarray([s["env"][0] for s in agentic_grpo.env_scores(None, records)])
    assert reward.tolist() == [float(t.verdict.passed) for t in trajs]
    adv = np.asarray(advantages.group_advantages(reward, g, "mean")).reshape(-1, g)
    for i, grp in enumerate(reward.reshape(-1, g)):
        np.testing.assert_allclose(adv[i], grp - grp.mean(), atol=1e-6)
        assert (np.sign(adv[i]) == np.sign(grp - grp.mean())).all()


def test_canonical_tool_calls_are_stored_structured_others_raw(tiny):
    _, _, tok = tiny
    hist = [{"role": "user", "content": "q"}]
    call = ToolCall("calculate", {"expression": "2+2"}, "call_0")
    canon = 'Let me.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>'
    msg = agentic.assistant_message(hist, canon, [call], "chatml", tok, [])
    assert msg["content"] == "Let me." and msg["tool_calls"][0]["function"]["name"] == "calculate"
    odd = canon.replace('{"name"', '{ "name"')  # parses the same, renders differently
    assert agentic.assistant_message(hist, odd, [call], "chatml", tok, []) == \
        {"role": "assistant", "content": odd}


def test_malformed_calls_are_observations_not_crashes(tiny):
    cfg, params, tok = tiny
    spec = _spec(style="agentic_echo:always_malformed", max_turns=3)
    trajs = agentic.rollouts(cfg, params, tok, TASKS, spec, group=2, temperature=1.0, seed=0)
    for t in trajs:
        assert t.stop == "max_turns" and t.turns == 3
        obs = [m["content"] for m in t.messages if m["role"] == "tool"]
        assert len(obs) == 3 and all(o.startswith("error: malformed tool call: tool call 1: not JSON")
                                     for o in obs)
        reward, verdict = agentic_grpo.verdict_of(t)
        assert reward == 0.0 and verdict["passed"] is False and "max_turns" in verdict["evidence"]
    # hermes: an unclosed call and non-JSON are parsed into error observations too
    turns = agentic.TokenTurns(_spec(style="hermes"), tok, "chatml")
    opening = [{"role": "user", "content": "q"}]
    t = turns.start({"id": "x"}, 0, LocalEnv(EchoEnv()), opening, [],
                    tok.encode(agentic.prompt_text(opening, "chatml", tok, [])))
    t.deadline = time.monotonic() + 10
    sampled = tok.encode("<tool_call>{nope</tool_call><tool_call>{") + [tok.eos_id]
    nxt = turns.after_turn(t, sampled, [-1.0] * len(sampled), "stop")
    assert "not JSON" in t.messages[-2]["content"] and "never closed" in t.messages[-1]["content"]
    assert nxt.startswith("\n<|im_start|>user\n<tool_response>\nerror: malformed tool call")
    assert nxt.endswith("<|im_start|>assistant\n") and not t.stop


def test_an_environment_that_times_out_ends_the_episode_failed(tiny):
    cfg, params, tok = tiny
    spec = _spec(env_kwargs=json.dumps({"delay_s": 1.5}), step_timeout_s=0.2)
    t0 = time.monotonic()
    envs = []
    trajs = agentic.rollouts(cfg, params, tok, TASKS, spec, group=2, temperature=1.0, seed=0,
                             envs=envs)
    assert time.monotonic() - t0 < 60
    assert len(envs) == 4 and not any(e is t.env for e, t in zip(envs, trajs))  # not reused
    for t in trajs:
        assert t.stop == "done" and t.turns == 1 and t.timed_out
        assert t.messages[-1]["content"].startswith("error: tool step took longer than")
        reward, verdict = agentic_grpo.verdict_of(t)
        assert reward == 0.0 and verdict["passed"] is False and "limit" in verdict["evidence"]
        rec = agentic_grpo.make_record(t, run="r", step=0, style="x")
        rec["verifier"] = verdict
        assert compile_rollout(rec, tok).reason == "verifier_failed"


def test_config_checks_name_the_field():
    from rossjax import cli
    from rossjax.train.rl import grpo

    for over, says in [("--config.reward.functions=('contains',)", "config.reward.functions"),
                       ("--config.agent.max_tokens=8", "config.agent.max_tokens"),
                       ("--config.agent.env=nope", "environment 'nope'"),
                       ("--config.agent.env_kwargs=[1]", "config.agent.env_kwargs"),
                       ("--config.grpo.overlong_buffer=1024", "agent.max_tokens = 1024")]:
        c = cli.parse_config([f"--config={ROOT}/configs/grpo_agentic.py:runlocal", over])[0]
        with pytest.raises(ValueError, match=says.replace("(", r"\(")):
            grpo.check_config(c)


# ---------------------------------------------------------------- the CLI, end to end

ENV = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu",
           PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
GRPO = ["grpo", f"--config={ROOT}/configs/grpo_agentic.py:runlocal",
        "--config.data.tasks=" + os.path.join(ROOT, "data", "agents", "calculator.jsonl"),
        "--config.agent.env=agentic_echo:EchoEnv", "--config.agent.style=agentic_echo:two_calls",
        "--config.agent.tools_in_prompt=False", "--config.agent.max_tokens=256",
        "--config.grpo.max_new_tokens=8", "--config.grpo.steps=4", "--config.checkpoint.save_every=1"]


def _cli(*argv):
    return subprocess.Popen([sys.executable, "-m", "rossjax.cli", *argv], env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ckpts(work):
    d = os.path.join(work, "checkpoints")
    return sorted(int(s) for s in os.listdir(d) if s.isdigit()) if os.path.isdir(d) else []


@pytest.mark.slow
def test_agentic_grpo_killed_resumed_then_curated_and_trained(tmp_path):
    """SIGKILL after checkpoint 2; the rerun resumes from it and records each step's 16
    episodes once; its history curates (stored ids projected) and `rossjax train` learns it."""
    work = str(tmp_path / "run")
    p = _cli(*GRPO, f"--workdir={work}")
    t0 = time.time()
    while not _ckpts(work) or max(_ckpts(work)) < 2:
        assert p.poll() is None, p.communicate()[0][-3000:]
        assert time.time() - t0 < 600
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == -9 and max(_ckpts(work)) < 4
    done = max(_ckpts(work))
    p = _cli(*GRPO, f"--workdir={work}")
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and f"from step {done}" in out, out[-3000:]
    rows = read_history(os.path.join(work, "history.jsonl"))
    assert [r["source"]["step"] for r in rows] == [s for s in range(4) for _ in range(16)]
    assert len({r["id"] for r in rows}) == len(rows) == 64
    assert all(r["agent"]["turns"] == 3 and r["messages"][2]["role"] == "tool" for r in rows)
    passed = sum(r["verifier"]["passed"] is True for r in rows)
    assert 0 < passed < 64 and all(r["verifier"]["name"] == "agents.echo" for r in rows)

    # ROSS relearns the history: a reviewer (scripted here) excludes the first line of each
    # episode's first turn; curate's exclude mode masks exactly it over the stored ids.
    reviewed = tmp_path / "reviewed.jsonl"
    with open(reviewed, "w") as f:
        for r in rows:
            first = r["messages"][1]["content"].split("\n")[0]
            r["annotation"] = {"status": "accept",
                               "exclude": [{"message": 1, "line": 1}] if first else []}
            f.write(json.dumps(r) + "\n")
    tok = load_tokenizer(os.path.join(work, "tokenizer"))
    for r in rows:
        if not r["verifier"]["passed"] or not r["annotation"]["exclude"]:
            continue
        ex = compile_rollout(r, tok)
        pol = np.zeros(len(r["token_ids"]), bool)
        for a, b in r["agent"]["policy_spans"]:
            pol[a:b] = True
        (_, a1, b1), (_, a3, b3) = [s for s in r["agent"]["message_spans"] if s[0] in (1, 3)]
        n_first = len(tok.encode(r["messages"][1]["content"].split("\n")[0]))
        assert ex.status == "kept" and ex.input_ids.tolist() == r["token_ids"]
        assert not ex.loss_mask[a1:a1 + n_first].any() and ex.loss_mask[a3:b3].all()
        assert not ex.loss_mask[~ex.eligible_mask.astype(bool)].any()
        assert ex.eligible_mask[pol].all()

    cur = str(tmp_path / "curated")
    p = _cli("curate", f"--config={ROOT}/configs/curate.py", f"--config.input={reviewed}",
             f"--config.tokenizer={work}/tokenizer", f"--config.output={cur}",
             "--config.recipe=ross", "--config.progress=False")
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out[-3000:]
    rep = json.load(open(os.path.join(cur, "report.json")))
    b = rep["buckets"]
    assert rep["input_rows"] == 64 and b["kept"] == passed and b["invalid"] == 0, rep
    assert set(rep["reasons"]["withheld"]) == {"verifier_failed"}

    trained = str(tmp_path / "sft")
    p = _cli("train", f"--config={ROOT}/configs/ross_sft.py:runlocal", f"--config.data.train={cur}",
             f"--workdir={trained}", "--config.train.num_steps=2", "--config.data.seq_len=256")
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out[-3000:]
    from rossjax.monitor import read_metrics
    m = read_metrics(trained)
    assert [r["step"] for r in m] == [1, 2] and all(np.isfinite(r["loss"]) for r in m)


WORKER = """
import sys, jax, numpy as np
from rossjax import cli
from rossjax.train.rl import grpo
port, pid, nproc, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
c = cli.parse_config(sys.argv[5:])[0]
c.mesh.num_devices = 0
c.optim.eps = 1e-3  # noise-level gradient entries stay still (see test_grpo_multihost.py)
if nproc > 1:
    c.distributed.enabled = True
    c.distributed.coordinator = f"127.0.0.1:{port}"
    c.distributed.num_processes, c.distributed.process_id = nproc, pid
    c.distributed.cpu_collectives = "gloo"
out = grpo.run(c, work)
assert jax.process_count() == nproc and jax.device_count() == 8
flat = {jax.tree_util.keystr(p): np.asarray(jax.experimental.multihost_utils.process_allgather(
            x, tiled=True)) for p, x in jax.tree_util.tree_flatten_with_path(out["state"]["params"])[0]}
if pid == 0:
    np.savez(work + "/params.npz", **flat)
"""


@pytest.mark.slow
def test_agentic_grpo_two_processes_equal_one(tmp_path):
    from test_grpo_multihost import _free_port

    argv = [a for a in GRPO[1:] if "steps" not in a and "save_every" not in a] + [
        "--config.grpo.steps=2", "--config.checkpoint.save_every=100"]
    port = _free_port()

    def spawn(pid, nproc, work, devices):
        env = dict(ENV, XLA_FLAGS=xla_flags(devices))
        return subprocess.Popen([sys.executable, "-c", WORKER, str(port), str(pid), str(nproc), work,
                                 *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    multi, single = str(tmp_path / "multi"), str(tmp_path / "single")
    procs = [spawn(0, 2, multi, 4), spawn(1, 2, multi, 4), spawn(0, 1, single, 8)]
    for p in procs:
        out = p.communicate(timeout=900)[0]
        assert p.returncode == 0, out[-3000:]
    ha, hb = (read_history(os.path.join(w, "history.jsonl")) for w in (multi, single))
    key = lambda rows: [(r["token_ids"], r["reward"], r["messages"]) for r in rows]
    assert key(ha) == key(hb) and len(hb) == 2 * 16
    a, b = np.load(os.path.join(multi, "params.npz")), np.load(os.path.join(single, "params.npz"))
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:  # gradients all-reduced over gloo, in another order than in one process
        np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)
