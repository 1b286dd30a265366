"""The library half of `rossjax demo` (the command itself is rossjax/cli/demo.py): the shipped
data, the tiny base model, the export parity check and the views that are not commands."""

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
