"""Run monitoring shared by training, GRPO, extraction and probe sweeps: a TensorBoard + JSONL
(+ optional Weights & Biases) metrics writer, its reader, a loss/reward plot, and a tqdm progress
bar with ETA. No jax import (curate-side code may use it): "process 0 only" asks jax for the
process index only when jax is already loaded.

Workdirs may be remote (`gs://...`): every path goes through etils.epath, and a file that is
appended to (metrics.jsonl, history.jsonl, TensorBoard events) is written through a local copy
uploaded on flush and close when the workdir is remote, since object stores cannot append.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
import tempfile
import time

from etils import epath


def is_lead_process() -> bool:
    """True on process 0 of a multi-process jax job, and whenever jax is not in use."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


def is_remote(path) -> bool:
    """A `scheme://` path (gs://, s3://): written through epath, not the local file system."""
    return "://" in os.fspath(path)


def _scalar(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


class RunFile:
    """An appendable UTF-8 text file of a run (metrics.jsonl, history.jsonl) that can be rewound
    to what a restored checkpoint had written. Local paths are appended to in place; a remote
    one through a local copy, uploaded at most every `sync_s` seconds and at close."""

    def __init__(self, path, *, fresh: bool = False, sync_s: float = 30.0):
        self.path = epath.Path(path)
        self.remote, self.sync_s, self._synced = is_remote(path), sync_s, time.monotonic()
        if self.remote:
            self._tmp = tempfile.mkdtemp(prefix="rossjax-spool-")
            self._local = os.path.join(self._tmp, self.path.name)
            if not fresh and self.path.exists():
                with open(self._local, "wb") as f:
                    f.write(self.path.read_bytes())
        else:
            self._tmp, self._local = None, os.fspath(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            open(self._local, "w").close()
        self._f = open(self._local, "a", encoding="utf-8")

    def rewind_bytes(self, n: int):
        """Cut the file back to its first `n` bytes (the size a checkpoint recorded)."""
        self._f.close()
        if os.path.getsize(self._local) > n:
            with open(self._local, "r+b") as f:
                f.truncate(n)
        self._f = open(self._local, "a", encoding="utf-8")

    def rewind_lines(self, keep):
        """Keep only the lines for which `keep(line)` is true (rewritten in place)."""
        self._f.close()
        with open(self._local, encoding="utf-8") as f:
            lines = [ln for ln in f if ln.strip() and keep(ln)]
        with open(self._local, "w", encoding="utf-8") as f:
            f.writelines(lines)
        self._f = open(self._local, "a", encoding="utf-8")

    def write(self, text: str):
        self._f.write(text)

    def flush(self, force: bool = False) -> bool:
        """Flush; a remote file is uploaded too when due (or forced). True when uploaded."""
        self._f.flush()
        if self.remote and (force or time.monotonic() - self._synced >= self.sync_s):
            self.path.write_bytes(open(self._local, "rb").read())
            self._synced = time.monotonic()
            return True
        return False

    def tell(self) -> int:
        return self._f.tell()

    def close(self):
        if self._f is not None:
            self.flush(force=True)
            self._f.close()
            self._f = None
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)


def step_at_most(last: int):
    """A `keep(line)` for RunFile.rewind_lines: JSON rows whose `step` is at most `last`."""
    def keep(line: str) -> bool:
        try:
            return int(json.loads(line).get("step", 0)) <= last
        except (ValueError, AttributeError):
            return False  # a half-written last line of a killed run
    return keep


class MetricsWriter:
    """Scalars to TensorBoard event files (`tb/`), `metrics.jsonl` and, with `wandb=PROJECT`, a
    Weights & Biases run, all from process 0 only.

    `resume_step`: the step a run (re)starts from. Rows after it are dropped from metrics.jsonl
    and TensorBoard purges its events after it, so steps redone after a crash are not recorded
    twice (0: a fresh run, earlier rows are dropped). None appends (probe sweeps, extraction).
    W&B resumes the same run (its id is kept in WORKDIR/wandb_run_id); it keeps points it had.
    """

    def __init__(self, workdir, *, enabled: bool | None = None, resume_step: int | None = None,
                 wandb: str = "", config: dict | None = None):
        self.enabled = is_lead_process() if enabled is None else enabled
        self.enabled = self.enabled and workdir is not None
        self._tb = self._jsonl = self._wandb = None
        if not self.enabled:
            return
        self.workdir = epath.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._jsonl = RunFile(self.workdir / "metrics.jsonl")
        if resume_step is not None:
            self._jsonl.rewind_lines(step_at_most(int(resume_step)))
        from tensorboardX import SummaryWriter

        # Remote: events are written locally and copied into WORKDIR/tb on flush and close.
        self._tb_local = (tempfile.mkdtemp(prefix="rossjax-tb-") if is_remote(workdir)
                          else os.fspath(self.workdir / "tb"))
        # Event files are named by the second they start in: the suffix keeps a quick restart's
        # file from replacing the last one.
        self._tb = SummaryWriter(logdir=self._tb_local, purge_step=(
            None if resume_step is None else int(resume_step) + 1),
            filename_suffix=f".{os.getpid()}.{time.time_ns() % 10**9}")
        if wandb:
            self._wandb = _wandb_run(self.workdir, wandb, config)

    def write(self, step: int, scalars: dict, prefix: str = "train"):
        if not self.enabled:
            return
        clean = {k: _scalar(v) for k, v in scalars.items()}
        for k, v in clean.items():
            if math.isfinite(v):
                self._tb.add_scalar(f"{prefix}/{k}", v, step)
        self._jsonl.write(json.dumps({"step": int(step), "split": prefix, **{
            k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}) + "\n")
        if self._jsonl.flush():  # a remote workdir's copies were due
            self._tb.flush()
            self._upload_tb()
        if self._wandb is not None:
            self._wandb.log({f"{prefix}/{k}": v for k, v in clean.items()}, step=int(step))

    def _upload_tb(self):
        if is_remote(self.workdir):
            dst = self.workdir / "tb"
            dst.mkdir(parents=True, exist_ok=True)
            for name in os.listdir(self._tb_local):
                (dst / name).write_bytes(open(os.path.join(self._tb_local, name), "rb").read())

    def close(self):
        if self._tb is not None:
            self._tb.close()
            self._upload_tb()
            self._jsonl.close()
            self._tb = self._jsonl = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_run(workdir, project: str, config: dict | None):
    """A W&B run that a resumed workdir continues (imported only when asked for)."""
    try:
        import wandb
    except ImportError:
        from rossjax.errors import ConfigError

        raise ConfigError(f"config.log.wandb is {project!r} but wandb is not installed "
                          f"(pip install 'rossjax[wandb]').") from None
    id_file = epath.Path(workdir) / "wandb_run_id"
    run_id = id_file.read_text().strip() if id_file.exists() else wandb.util.generate_id()
    id_file.write_text(run_id)
    return wandb.init(project=project, id=run_id, resume="allow", config=config or {},
                      name=epath.Path(workdir).name)


def read_metrics(workdir, split: str = "train") -> list[dict]:
    """The rows of `metrics.jsonl` for one split (used by tests and reports)."""
    path = epath.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == split]


def write_plot(workdir, panels, out: str = "metrics.png", title: str = "") -> str | None:
    """A PNG of metrics.jsonl beside it: one panel per `(metric, splits)` in `panels`, each
    split a line over steps. Returns its path, or None when nothing was logged (or not lead)."""
    if not is_lead_process():
        return None
    rows = {s: read_metrics(workdir, s) for _, splits in panels for s in splits}
    panels = [(m, [s for s in splits if any(m in r for r in rows[s])]) for m, splits in panels]
    panels = [p for p in panels if p[1]]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(panels), 3.5))
    for i, (metric, splits) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for s in splits:
            pts = [(r["step"], r[metric]) for r in rows[s]
                   if isinstance(r.get(metric), (int, float))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None,
                    label=s)
        ax.set_xlabel("step")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
        if len(splits) > 1:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    path = epath.Path(workdir) / out
    path.write_bytes(buf.getvalue())
    return os.fspath(path)


class Progress:
    """A tqdm bar with ETA on process 0; a no-op elsewhere."""

    def __init__(self, total: int, initial: int = 0, desc: str = "train", enabled: bool | None = None):
        enabled = is_lead_process() if enabled is None else enabled
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True,
                             mininterval=1.0, smoothing=0.1)

    def update(self, n: int = 1, **postfix):
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v)
                                       for k, v in postfix.items()}, refresh=False)
            self._bar.update(n)

    def write(self, msg: str):
        if self._bar is not None:
            self._bar.write(msg)

    def close(self):
        if self._bar is not None:
            self._bar.close()
