"""`make demo`: the most complete pipeline that exists, on the embedded default data in data/.

    rossjax demo [--workdir=runs/demo] [--steps=N] [--agent_sft_steps=N] [--agent_grpo_steps=N]

1. curate   data/rollouts/sample.jsonl: re-run the verifiers (math-verify, sandboxed code), render
            with ChatML, compile the reviewers' keep/exclude annotations into token loss masks
            with the real Qwen tokenizer; every row ends kept, withheld(reason) or invalid(reason).
2. base     a tiny random Qwen2-shaped model over the full Qwen vocabulary, saved as a Hugging
            Face folder (the stand-in for "the final checkpoint of the RL run").
3. train    ROSS masked SFT on the curated rows (loss = masked NLL summed over the batch / number
            of supervised tokens), orbax checkpoints and TensorBoard metrics in the workdir.
4. export   the trained params as a Hugging Face folder; transformers reloads it and its logits
            are compared with rossjax's.
5. look     an HTML view of one compiled mask, the loss curve as PNG, and a route-diverse
            selection over the shipped math solutions with its PCA scatter.
6. agents   the vault learning demo (docs/agents.md, "The vault demo"): a tiny model over an
            ASCII tokenizer is warmed up by SFT on data/agents/vault_sft.jsonl, exported, then
            trained by agentic GRPO on the `vault` env (`:runlocal,vault`); the env's reward
            and the episodes that opened the vault are printed per step.
7. serve    `rossjax serve` on the GRPO-trained vault model (exported as a Hugging Face folder)
            as a subprocess on a free 127.0.0.1 port, one chat request through the project's
            own OpenAI-compatible client (rossjax.openai_api.ChatClient), then the server stops.

Each step is the real command, run through the dispatcher; the pieces that are not commands
live in rossjax/demo.py.
"""

from __future__ import annotations

import json
import os
import time

from rossjax.cli.flags import parse_config, repo_config


def _run(argv):
    from rossjax.cli import main as dispatch

    rc = dispatch(argv)
    if rc:
        raise SystemExit(f"rossjax demo: step `rossjax {' '.join(argv[:1])}` failed (exit {rc}).")


def main(argv) -> int:
    from absl import flags as absl_flags

    from rossjax import demo
    from rossjax.agents import vault
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    def extra(fv):
        absl_flags.DEFINE_integer("steps", 30, "Optimizer steps of the masked SFT stage.",
                                  flag_values=fv)
        # 600 is the warm-up docs/agents.md measured GRPO's rise from (reward ~.56 -> ~.8 in 8
        # steps, 2 seeds); at 400 steps with fewer opens the copy decayed in one seed of two.
        absl_flags.DEFINE_integer("agent_sft_steps", 600, "SFT warm-up steps of the vault "
                                  "agents stage.", flag_values=fv)
        absl_flags.DEFINE_integer("agent_grpo_steps", 8, "Agentic GRPO steps (32 episodes "
                                  "each) of the vault agents stage.", flag_values=fv)

    _, flags, _ = parse_config(argv, extra_flags=extra)
    wd = os.path.abspath(flags.workdir or "runs/demo")
    os.makedirs(wd, exist_ok=True)
    t0 = time.time()
    curated, sft, hf_out = (os.path.join(wd, d) for d in ("curated", "sft", "export_hf"))

    print("== 1/7 curate the shipped rollouts (re-verify, compile masks)")
    _run(["curate", f"--config={repo_config('curate.py')}",
          f"--config.input={demo.data_path('rollouts', 'sample.jsonl')}",
          f"--config.output={curated}", "--config.verify=rerun"])
    with open(os.path.join(curated, "report.json")) as f:
        report = json.load(f)

    print("== 2/7 build a tiny random Qwen2 base model as a Hugging Face folder")
    vocab = demo.padded_vocab(report["config"]["tokenizer"])
    base = os.path.join(wd, "base_hf")
    demo.base_model(base, vocab)

    print(f"== 3/7 ROSS masked SFT for {flags.steps} steps")
    _run(["train", f"--config={repo_config('ross_sft.py')}:runlocal", f"--config.model.path={base}",
          f"--config.data.train={curated}", "--config.data.seq_len=512",
          "--config.train.global_batch=4", "--config.train.micro_batches=2",
          "--config.train.epochs=100", f"--config.train.num_steps={flags.steps}",
          "--config.train.loss_chunk=128", f"--workdir={sft}"])

    print("== 4/7 export to a Hugging Face folder and reload it with transformers")
    _run(["export", f"--checkpoint={sft}", "--format=hf", hf_out])
    diff = demo.export_parity(hf_out, vocab)

    print("== 5/7 views: a compiled mask, the loss curve, a route-diverse selection")
    pick = demo.most_masked_example(curated)
    html = os.path.join(wd, "mask.html")
    _run(["inspect", curated, "--id", pick["id"], "--out", html, "--no-color"])
    plot = demo.loss_plot(sft)
    sel = os.path.join(wd, "select")
    _run(["select", f"--config={repo_config('select_routes.py')}:runlocal",
          f"--config.input={demo.data_path('select', 'sample.jsonl')}",
          f"--config.output={sel}"])

    print(f"== 6/7 agentic GRPO on the vault env: {flags.agent_sft_steps} SFT warm-up steps, "
          f"then {flags.agent_grpo_steps} GRPO steps")
    agents = os.path.join(wd, "agents")
    tok = write_ascii_tokenizer(os.path.join(agents, "tokenizer"))
    init = demo.vault_base(os.path.join(agents, "init_hf"))
    vcur, vsft, vgrpo = (os.path.join(agents, d) for d in ("curated", "sft", "grpo"))
    _run(["curate", f"--config={repo_config('curate.py')}",
          f"--config.input={demo.data_path('agents', 'vault_sft.jsonl')}",
          f"--config.output={vcur}", f"--config.tokenizer={tok}",
          "--config.rows=verifier_positive", "--config.mask_mode=eligible", "--config.verify=stored"])
    _run(["train", f"--config={repo_config('ross_sft.py')}:runlocal,positive_sft",
          f"--config.data.train={vcur}", f"--config.model.path={init}", "--config.data.seq_len=128",
          "--config.train.batch_mode=sequences", "--config.train.global_batch=32",
          "--config.train.epochs=40", f"--config.train.num_steps={flags.agent_sft_steps}",
          "--config.optim.peak_lr=3e-3", "--config.optim.end_lr=3e-4", f"--workdir={vsft}"])
    _run(["export", f"--checkpoint={vsft}", "--format=hf", f"{vsft}/hf"])
    _run(["grpo", f"--config={repo_config('grpo_agentic.py')}:runlocal,vault",
          f"--config.model.path={vsft}/hf", f"--config.grpo.steps={flags.agent_grpo_steps}",
          f"--workdir={vgrpo}"])
    rewards, opened, episodes = demo.vault_curve(vgrpo)
    for k, r in enumerate(rewards):
        opens = f"; opened the vault {opened[k]}/{episodes[k]}" if k < len(opened) else ""
        print(f"  GRPO step {k + 1}: reward_mean {r:.3f}{opens}")
    served = os.path.join(wd, "vault_hf")
    _run(["export", f"--checkpoint={vgrpo}", "--format=hf", served])

    print("== 7/7 rossjax serve the vault model and ask it through the OpenAI-compatible client")
    from rossjax.openai_api import ChatClient
    from rossjax.reconstruct.local import LocalServer

    log, question, name = os.path.join(wd, "serve.log"), vault.PROMPT, os.path.basename(served)
    # the server process is stopped however this block ends (LocalServer.__exit__)
    with LocalServer(served, log, max_len=256, slots=1, model_id=name, startup_s=120,
                     where="rossjax demo") as srv:
        url = srv.url
        client = ChatClient(url, model=name, temperature=0, max_tokens=32, max_retries=0)
        try:
            reply = client.ask([{"role": "user", "content": question}], stage="demo").text
        finally:
            client.close()
    print(f"  asked {question!r}; the served model answered {reply[:80]!r}")

    losses = demo.losses(sft)
    b = report["buckets"]
    print(f"""
rossjax demo done in {time.time() - t0:.0f} s; outputs under {wd}
  curated   {report['input_rows']} rollouts -> {b['kept']} kept, {b['withheld']} withheld, \
{b['invalid']} invalid; {report['tokens']['kept_supervised']} supervised tokens, \
TER {report['ter']:.3f}   ({curated}/report.json)
  trained   {len(losses)} steps of masked SFT, loss {losses[0]:.3f} -> {losses[-1]:.3f}   \
({sft}; {demo.tensorboard_hint(sft + '/tb')})
  exported  {hf_out}  (transformers reloads it; max |logit diff| {diff:.2e})
  look at   {html} (mask of {pick['id']}), {plot}, {sel}/selection.png
  agents    vault GRPO reward first->last {demo.vault_summary(rewards, opened, episodes)}   \
({vgrpo})
  served    {os.path.basename(served)} at {url} answered {reply[:40]!r} to {question!r} \
(log: {log})""")
    return 0
