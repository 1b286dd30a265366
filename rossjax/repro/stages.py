"""The shared stages of every repro experiment, each one a real rossjax command or public API.

curate, train, export and select run through the CLI dispatcher in this process
(`rossjax.cli.main([...])`), exactly as a user types them; generation uses
`rossjax.sample.generate` on the exported Hugging Face folder loaded with `rossjax.models`.

Resume: `Stages(dir).run(name, fn)` calls fn once and stores its JSON result in
`dir/.stages/<name>.json`; a rerun returns the stored result (a stage interrupted half-way has no
marker, so it reruns, and the commands it calls resume or overwrite their own outputs).
`Stages(dir, key=...)` records the experiment's sizes and constants in `dir/.stages/key.json`
and refuses a folder that holds a run of other ones: its stages, checkpoints and held-out split
belong to that run (quick trains on problems the full run holds out).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time


class StageFailed(RuntimeError):
    pass


class Stages:
    def __init__(self, root: str, log=None, key: dict | None = None):
        self.root = root
        self.dir = os.path.join(root, ".stages")
        os.makedirs(self.dir, exist_ok=True)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        if key is not None:
            self._check_key(json.loads(json.dumps(key)))  # tuples as lists, as stored

    def _check_key(self, key: dict) -> None:
        from rossjax.errors import UsageError, read_json

        path = os.path.join(self.dir, "key.json")
        if os.path.exists(path):
            old = read_json(path, "repro run key")
            if old != key:
                diff = ", ".join(f"{k}: {old.get(k)} -> {key.get(k)}"
                                 for k in sorted(set(old) | set(key)) if old.get(k) != key.get(k))
                raise UsageError(f"{self.root} holds a repro run with other settings ({diff}); "
                                 f"give a fresh --workdir (or delete that folder).")
        elif os.listdir(self.dir):
            raise UsageError(f"{self.root} holds repro stages without a key.json (an older "
                             f"rossjax); give a fresh --workdir (or delete that folder).")
        else:
            with open(path, "w") as f:
                json.dump(key, f)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name.replace("/", "__") + ".json")

    def done(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def run(self, name: str, fn):
        p = self.path(name)
        if os.path.exists(p):
            with open(p) as f:
                return json.load(f)["result"]
        t0 = time.time()
        result = fn()
        tmp = p + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"result": result, "seconds": round(time.time() - t0, 2)}, f)
        os.replace(tmp, p)
        return result


# The command dispatcher (`rossjax.cli.main`), handed in by `rossjax repro` (rossjax/cli/repro.py):
# the experiments sit below the CLI and never import it.
COMMAND = None


def cli(args: list[str], quiet: bool = True) -> None:
    """One rossjax command in this process; a non-zero exit raises with what it printed."""
    if COMMAND is None:
        raise RuntimeError("rossjax.repro runs commands through the dispatcher that "
                           "rossjax.repro.run(..., command=rossjax.cli.main) hands it.")
    main = COMMAND
    out, err = io.StringIO(), io.StringIO()
    redirect = (contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)) if quiet else ()
    with contextlib.ExitStack() as st:
        for r in redirect:
            st.enter_context(r)
        rc = main(list(args))
    if rc:
        raise StageFailed(f"rossjax {' '.join(args)} exited {rc}:\n{err.getvalue()[-2000:]}")


def write_jsonl(path: str, rows) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)
    return path


def ascii_tokenizer(folder: str):
    """The byte-level ASCII tokenizer tiny from-scratch models use (path, loaded tokenizer)."""
    from rossjax.curate import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    path = write_ascii_tokenizer(folder)
    return path, load_tokenizer(path)


def curate(rollouts: str, out: str, tokenizer: str, *, rows: str = "accepted",
           mask_mode: str = "annotated", max_length: int = 0) -> dict:
    """`rossjax curate` with stored verdicts; returns its report.json."""
    from rossjax.resources import config_path as repo_config

    cli(["curate", f"--config={repo_config('curate.py')}", f"--config.input={rollouts}",
         f"--config.output={out}", f"--config.tokenizer={tokenizer}", f"--config.rows={rows}",
         f"--config.mask_mode={mask_mode}", "--config.verify=stored",
         f"--config.max_length={max_length}", "--config.progress=False"])
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def curated_summary(rep: dict) -> dict:
    """The numbers of a curate report.json the experiments use."""
    return {"kept": rep["buckets"]["kept"], "ter": rep["ter"], "tokens": rep["tokens"]["kept_total"],
            "supervised_tokens": rep["tokens"]["kept_supervised"],
            "withheld": rep["reasons"]["withheld"], "kept_by_review": rep.get("kept_by_review")}


def train(curated: str, workdir: str, recipe: str, *, seed: int, steps: int, model: dict,
          seq_len: int, batch: int, lr: float, vocab_size: int, rows: int, micro: int = 1,
          init: str = "", warmup_frac: float = 0.05) -> dict:
    """`rossjax train` (configs/ross_sft.py:runlocal,<recipe>) on a tiny model, `batch`
    rollouts per step (batch_mode=sequences, the paper's batch semantics); exports the last step
    as a Hugging Face folder WORKDIR/hf. Returns the last logged metrics. The step's rollouts
    pack into at most `batch` rows of `seq_len`; with `micro` micro-batches the all-padding ones
    are skipped, so short rollouts cost what they hold, not batch x seq_len.

    `rows` (the curated dir's kept rows) sets the epochs so that `steps` batches exist with room
    to spare: the trainer reads its epochs once up front to count batches.
    """
    from rossjax.resources import config_path as repo_config

    epochs = int(steps * batch * 1.2 / max(rows, 1)) + 2
    over = [f"--config.model.{k}={v}" for k, v in model.items()]
    args = ["train", f"--config={repo_config('ross_sft.py')}:runlocal,{recipe}",
            f"--workdir={workdir}", f"--config.data.train={curated}",
            f"--config.data.seq_len={seq_len}", "--config.train.batch_mode=sequences",
            f"--config.train.global_batch={batch}",
            f"--config.train.micro_batches={micro}", f"--config.train.epochs={epochs}",
            f"--config.train.num_steps={steps}", f"--config.train.seed={seed}",
            f"--config.train.loss_chunk={seq_len}", f"--config.train.log_every={max(1, steps // 20)}",
            "--config.train.eval_every=0", f"--config.checkpoint.save_every={steps}",
            "--config.checkpoint.keep=1", f"--config.optim.peak_lr={lr}",
            f"--config.optim.warmup_frac={warmup_frac}",
            f"--config.optim.end_lr={lr / 10}"]
    if init:
        args.append(f"--config.model.path={init}")
    else:
        args.append(f"--config.model.vocab_size={vocab_size}")
    cli(args + over)
    export_finished("train", workdir, steps)
    return read_metrics(workdir)


def export_finished(command: str, workdir: str, steps: int) -> str:
    """`rossjax export` of a finished run's last checkpoint to WORKDIR/hf. A run stopped early
    (SIGTERM saves and exits 0) raises instead, so its stage gets no marker and a rerun resumes it."""
    step = read_metrics(workdir).get("step", 0)
    if step < steps:
        raise StageFailed(f"rossjax {command} in {workdir} stopped at step {step} of {steps}; "
                          f"rerun to resume from its checkpoint.")
    hf = os.path.join(workdir, "hf")
    cli(["export", f"--checkpoint={workdir}", "--format=hf", hf])
    return hf


def read_metrics(workdir: str) -> dict:
    """Last value of every scalar in WORKDIR/metrics.jsonl."""
    last: dict = {}
    path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                last.update({k: v for k, v in row.items() if isinstance(v, (int, float))})
    return last


def load_model(hf_dir: str):
    from rossjax import models

    return models.load_hf(hf_dir, dtype="float32")


def complete(model, tok, prompts: list[str], *, max_new: int, temperature: float = 0.0,
             num_samples: int = 1, seed: int = 0, batch: int = 256) -> list[list[dict]]:
    """Chat-rendered completions of user prompts: per prompt, num_samples of {text, tokens}.

    Prompts render with the ChatML template the training rows were curated with, so the model
    sees exactly the context it was trained on.
    """
    from rossjax import sample
    from rossjax.train.rl.rollout import render_prompt

    cfg, params = model
    enc = [tok.encode(render_prompt([{"role": "user", "content": p}], "chatml", tok)) for p in prompts]
    out: list[list[dict]] = []
    for i in range(0, len(enc), batch):
        res = sample.generate(cfg, params, enc[i:i + batch], max_new, temperature=temperature,
                              num_samples=num_samples, seed=seed + i, stop_ids=(tok.eos_id,))
        seqs = res.sequences()
        for j in range(len(enc[i:i + batch])):
            group = []
            for s in seqs[j * num_samples:(j + 1) * num_samples]:
                body = [t for t in s if t != tok.eos_id]
                group.append({"text": tok.decode(body), "tokens": len(s)})
            out.append(group)
    return out


def enable_compile_cache(folder: str) -> None:
    """JAX's persistent compilation cache: every seed and recipe of an experiment compiles the
    same train and sampling programs, so later runs load them instead of compiling again."""
    import jax

    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def init_model(folder: str, seed: int, **shape) -> str:
    """A randomly initialized Qwen2-shaped model saved as a Hugging Face folder: the shared
    starting point every recipe of one seed trains from (`--config.model.path`)."""
    import jax

    from rossjax import models

    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    cfg = models.ModelConfig(model_type="qwen2", qkv_bias=True, tie_embeddings=True, **shape)
    params = models.init_params(cfg, jax.random.PRNGKey(seed))
    models.save_hf(cfg, params, folder)
    return folder


def write_jsonl_rows(path: str, rows: list) -> list:
    """write_jsonl, returning the rows (for a stage that also summarizes them)."""
    write_jsonl(path, rows)
    return rows
