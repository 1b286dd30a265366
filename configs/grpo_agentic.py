"""Multi-turn GRPO with a tool environment: the trajectory reward is the environment's verdict.

Run:
  rossjax grpo --config=configs/grpo_agentic.py --config.model.path=HF_QWEN_DIR --workdir=runs/agent
  rossjax grpo --config=configs/grpo_agentic.py:runlocal --workdir=/tmp/agent-local

Each task's `group_size` candidates are live sequences on the rollout engine: a policy turn is
sampled until the end-of-turn token (at most `grpo.max_new_tokens`), its tool calls are parsed
(`agent.style`: hermes <tool_call> JSON, react, or module:function), the environment steps
(`agent.step_timeout_s`, `agent.episode_timeout_s`), and the observations, rendered as tool
messages by the chat template, are appended to the live sequence (no prefill of the history)
until the policy answers without a call, the env says done, `agent.max_turns`, or the context
budget `agent.max_tokens` (tokens of the whole trajectory). The loss runs on the sampled tokens
only (observations and template tokens are context); advantages, aggregation, KL, IS
corrections and dynamic sampling are those of single-turn GRPO. Every episode is appended to
WORKDIR/history.jsonl with its exact token ids; `rossjax curate` relearns it (docs/agents.md).

Environments (`agent.env`): calculator (the shipped demo, data/agents/calculator.jsonl),
python (code in the sandbox), corpus (`--config.agent.env_kwargs='{"path": "docs.jsonl"}'`),
or a user's `module:Class` (a rossjax.agents.Environment subclass).

`:runlocal` (tiny random Qwen2, ASCII tokenizer, 4 tasks x 4 episodes of up to 3 turns, 4
steps) runs the whole path on CPU in about a minute. Measured: its reward stays 0. A random
0.1M-parameter model never writes a `<tool_call>` nor the exact product of two numbers, so
the calculator's verdict never passes and every group's advantages are 0; learning on the demo
needs a policy that already calls the tool (an instruct model via `--config.model.path`; not
measured here). `:runlocal` shows the mechanics (engine rollouts, history, resume), not
learning. `:runlocal,warmstart --config.model.path=SFT_HF` starts from the demo's SFT warm-up
(data/agents/calculator_sft.jsonl; recipe and measured figures in docs/agents.md: ~80% of
episodes pass from step 1, and 10 GRPO steps did not raise it).
`:runlocal,vault --config.model.path=SFT_HF` is the learning demo: the `vault` env (a code only
its tool returns) from the warm-up of data/agents/vault_sft.jsonl; recipe and the measured
reward curves in docs/agents.md ("The vault demo"), asserted by tests/test_agents_vault.py.
"""

import ml_collections as mlc

from rossjax.configs import common


def agent_section() -> mlc.ConfigDict:
    return mlc.ConfigDict(dict(
        env="calculator",
        env_kwargs="{}",          # JSON object: keyword arguments of the env class
        style="hermes",           # hermes | react | module:function (text, n0) -> (calls, errors)
        max_turns=6,
        max_tokens=4096,          # context budget of a trajectory (tokens); the update row length
        tools_in_prompt=True,     # the env's tools rendered into the prompt (and the row's `tools`)
        step_timeout_s=10.0,
        episode_timeout_s=120.0))


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal", "warmstart", "vault"), "grpo_agentic.py")
    c = common.grpo_config()
    c.run_name = "grpo-agentic"
    c.data.tasks = common.data_file("agents", "calculator.jsonl")
    c.agent = agent_section()
    c.reward.functions, c.reward.weights = ("env",), (1.0,)
    c.reward.workers = 0              # the env judges during the rollout; no reward processes
    c.grpo.steps = 200
    c.grpo.contexts = 16
    c.grpo.group_size = 8
    c.grpo.max_new_tokens = 512       # one policy turn
    c.grpo.advantages = "mean"        # Dr. GRPO, as grpo_verifier.py
    c.grpo.agg = "seq_mean_token_sum_norm"  # Dr. GRPO's constant normalizer: agent.max_tokens
    c.optim.peak_lr = c.optim.end_lr = 1e-6
    if "runlocal" in variants:
        common.runlocal_grpo(c, steps=4, max_new_tokens=24, save_every=2)
        c.reward.workers = 0
        c.agent.max_turns, c.agent.max_tokens = 3, 1024
        c.grpo.agg = "token_mean"
        c.optim.peak_lr = c.optim.end_lr = 3e-3
    if "warmstart" in variants:
        # `:runlocal,warmstart`: from the demo's SFT warm-up (docs/agents.md, "The demo
        # learns"): its shipped demonstrations have no system message and no tool block, so the
        # episodes open the same way; one turn (a call is ~80 ASCII tokens) fits 96 tokens.
        c.agent.env_kwargs = '{"system": ""}'
        c.agent.tools_in_prompt = False
        c.agent.max_turns, c.agent.max_tokens = 3, 320
        c.grpo.max_new_tokens = 96
        c.grpo.steps = 10
        # measured (docs/agents.md): 3e-4 breaks the warm-up's call format in 5 steps; 3e-5 keeps it
        c.optim.peak_lr = c.optim.end_lr = 3e-5
    if "vault" in variants:
        # `:runlocal,vault --config.model.path=SFT_HF`: the learning demo (docs/agents.md, "The
        # vault demo"): the warm-up of data/agents/vault_sft.jsonl opens the vault in about
        # call_share of its episodes; GRPO raises that. ReAct calls (`Action: open[]`, 14 ASCII tokens;
        # a hermes call is ~45, too long for a tiny model to spell reliably after a short SFT).
        c.data.tasks = common.data_file("agents", "vault.jsonl")
        c.agent.env, c.agent.style = "vault", "react"
        c.agent.tools_in_prompt = False
        c.agent.max_turns, c.agent.max_tokens = 2, 160
        c.grpo.max_new_tokens = 32
        c.grpo.contexts, c.grpo.group_size = 4, 8
        c.grpo.steps = 8
        c.grpo.agg = "token_mean"
        c.optim.peak_lr = c.optim.end_lr = 1e-3
    return c
