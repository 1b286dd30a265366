"""The library half of `rossjax demo` (the command itself is rossjax/cli/demo.py): the shipped
data, the tiny base models, the export parity check, the views that are not commands and the
vault GRPO curve."""

from __future__ import annotations

import importlib.resources
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def data_path(*parts: str) -> str:
    """A file under the shipped sample data: the `rossjax/data` package data (in a checkout a
    link to data/, which the wheel copies in), else the checkout's data/ folder."""
    shipped = importlib.resources.files("rossjax") / "data"
    if shipped.is_dir():
        return os.path.join(os.path.realpath(str(shipped)), *parts)
    return os.path.join(ROOT, "data", *parts)


def padded_vocab(tokenizer_name: str) -> int:
    """The tokenizer's vocabulary rounded up to a multiple of 128, like real checkpoints."""
    from rossjax.curate import load_tokenizer

    vocab = load_tokenizer(tokenizer_name).vocab_size
    return -(-vocab // 128) * 128


def base_model(out: str, vocab_size: int):
    """A tiny random Qwen2-shaped model saved as a Hugging Face folder: the stand-in for the
    final checkpoint of the RL run."""
    import jax

    from rossjax import models

    cfg = models.get_preset("tiny_qwen2", vocab_size=vocab_size)
    models.save_hf(cfg, models.init_params(cfg, jax.random.key(0)), out)
    return cfg


def export_parity(hf_dir: str, vocab_size: int) -> float:
    """Max |logits| difference between rossjax and transformers on the exported folder."""
    import torch
    import transformers

    from rossjax import models

    cfg, params = models.load_hf(hf_dir)
    tokens = np.random.default_rng(0).integers(0, vocab_size, (2, 24)).astype(np.int32)
    ours = np.asarray(models.forward(cfg, params, tokens)[0])
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(tokens).long()).logits.numpy()
    return float(np.abs(ours - theirs).max())


def tensorboard_hint(logdir: str) -> str:
    """How to look at the run's TensorBoard events: the command, and how to install the viewer
    when it is not (rossjax writes the events with tensorboardX; the viewer is an extra)."""
    import importlib.util
    import shutil

    cmd = f"tensorboard --logdir {logdir}"
    if importlib.util.find_spec("tensorboard") is not None or shutil.which("tensorboard"):
        return cmd
    return f"{cmd}, after pip install 'rossjax[tensorboard]' (or pip install tensorboard)"


def most_masked_example(curated: str) -> dict:
    """The compiled example whose mask excludes the most eligible tokens (the one worth viewing)."""
    from rossjax.curate import read_compiled

    return max(read_compiled(curated),
               key=lambda e: int(np.sum(e["eligible_mask"]) - np.sum(e["loss_mask"])))


def losses(workdir: str) -> list[float]:
    from rossjax.monitor import read_metrics

    return [r["loss"] for r in read_metrics(workdir)]


def loss_plot(workdir: str) -> str | None:
    """The training loss curve as WORKDIR/loss.png (None when no metrics were written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rossjax.monitor import read_metrics

    rows = read_metrics(workdir)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker="o", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("masked NLL / supervised token")
    ax.set_title("ROSS relearning (demo)")
    fig.tight_layout()
    out = os.path.join(workdir, "loss.png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def vault_base(folder: str) -> str:
    """The random tiny_qwen2-shaped model over the ASCII vocabulary the vault demo starts from
    (docs/agents.md, "The vault demo")."""
    from rossjax.repro.stages import init_model

    return init_model(folder, 0, vocab_size=256, d_model=64, n_layers=2, n_heads=4,
                      n_kv_heads=2, head_dim=16, ffn_dim=128)


def vault_curve(grpo_workdir: str) -> tuple[list[float], list[int], list[int]]:
    """Per GRPO step: the env's mean reward (metrics.jsonl), and how many of the step's episodes
    opened the vault and how many there were (history.jsonl: an episode opened it when its first
    assistant turn is exactly the call, as tests/test_agents_vault.py counts)."""
    from collections import Counter

    from rossjax.agents import vault
    from rossjax.monitor import read_metrics
    from rossjax.train.rl.history import read_history

    rewards = [r["reward_mean"] for r in read_metrics(grpo_workdir) if "reward_mean" in r]
    opened, total = Counter(), Counter()
    path = os.path.join(grpo_workdir, "history.jsonl")
    for r in read_history(path) if os.path.exists(path) else []:
        step, msgs = r["source"]["step"], r["messages"]
        total[step] += 1
        opened[step] += len(msgs) > 1 and msgs[1].get("content") == vault.CALL
    steps = sorted(total)
    return rewards, [opened[s] for s in steps], [total[s] for s in steps]


def vault_summary(rewards: list[float], opened: list[int], episodes: list[int]) -> str:
    """`first->last` of the GRPO reward (and of the opens, when the history was read)."""
    if not rewards:
        return "(no reward_mean in metrics.jsonl)"
    out = f"{rewards[0]:.3f} -> {rewards[-1]:.3f} over {len(rewards)} steps"
    if opened:
        out += (f"; opened the vault {opened[0]}/{episodes[0]} -> {opened[-1]}/{episodes[-1]} "
                "episodes")
    return out
