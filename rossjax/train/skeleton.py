"""The run scaffolding every trainer shares. `rossjax train` (sft/trainer.py) and `rossjax grpo`
(rl/grpo.py) are `Skeleton` subclasses that say only what is their own.

A run, in order (`__init__`): distributed init; the workdir checked writable, locked, stale
temporary checkpoints removed (workdir.prepare); the trainer's set-up that needs no model
(`configure`, `prepare`: SFT's data plan, GRPO's task file); the checkpointer and the resume check
(same config, same data: resume.py); a workdir already at the last step is `complete` and loads
nothing more; else the model and its pieces (`build`) and a free-space check for one checkpoint.
`start()` restores the latest checkpoint (a damaged one falls back) or makes a fresh state, saves
the config and run files, opens the metrics writer and the progress bar. `fit()` runs the steps
under a PreemptionGuard: after each step its hooks run in order (metrics, progress, the
trainer's own, the periodic checkpoint: Levanter's trainer hooks), then a stop request (SIGTERM,
SIGHUP, the first Ctrl-C, or the trainer's `stop_reason`) saves a checkpoint and ends the loop.
`close()` ends the files and draws metrics.png; `execute()` is all of it. `stopped_message` is the last line a stopped
run prints: the step it stopped at and the command that resumes it.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Callable

import jax

from rossjax import sharding
from rossjax.monitor import MetricsWriter, Progress, write_plot
from rossjax.train import checkpoint as ckpt_lib, resume, workdir as workdir_lib


@dataclasses.dataclass
class StepInfo:
    """What a hook sees after a step: `done` steps of `total` finished, that step's metrics."""
    done: int
    total: int
    metrics: dict

    @property
    def last(self) -> bool:
        return self.done == self.total


@dataclasses.dataclass
class Hook:
    """`fn(info)` after every `every`-th step (never when `every` <= 0). `last`: True also runs
    it after the last step, False never there (the trainer's `finish` does it), None: `every`
    alone decides."""
    fn: Callable[[StepInfo], None]
    every: int = 1
    last: bool | None = None

    def due(self, info: StepInfo) -> bool:
        if info.last and self.last is not None:
            return self.last
        return self.every > 0 and info.done % self.every == 0


def resume_command(command: str, workdir: str, argv=None) -> str:
    """The command that continues a stopped run: the one given (`argv`, after the command
    name), else the run's saved config with its workdir."""
    if argv:
        return shlex.join(["rossjax", command, *argv])
    return shlex.join(["rossjax", command, f"--config={os.path.join(workdir, 'config.py')}",
                       f"--workdir={workdir}"])


def stopped_message(command: str, workdir: str, out: dict, summary: str, argv=None) -> str:
    """The last line of a run that stopped before its last step (`out`: the run's result)."""
    return (f"rossjax {command}: stopped early at step {out['step']} of {out['total']} "
            f"({out['stopped_by']}; {summary}); its checkpoint is in "
            f"{os.path.join(workdir, 'checkpoints')}. Resume with: "
            f"{resume_command(command, workdir, argv)}")


def interrupted_message(command: str, workdir: str, argv=None) -> str:
    """What a Ctrl-C outside the steps says (set-up, or the closing save: no step is cut)."""
    return (f"rossjax {command}: stopped by Ctrl-C outside a training step; checkpoints already "
            f"in {os.path.join(workdir, 'checkpoints')} are kept. Rerun to start or resume: "
            f"{resume_command(command, workdir, argv)}")


class Skeleton:
    """One training run. Subclasses set `command`, `desc` and `plot` and implement the hooks
    below that raise NotImplementedError; the others are optional."""

    command = ""          # "train" | "grpo": messages, the lock, resume.json
    desc = ""             # the progress bar's label
    plot: tuple = ()      # metrics.png panels (monitor.write_plot)

    def __init__(self, cfg, workdir: str):
        sharding.initialize_distributed(cfg.distributed)
        self.check_job(cfg)
        self.lead = jax.process_index() == 0  # the process that writes files
        self.workdir = workdir
        ckpt_dir = os.path.join(workdir, "checkpoints")
        workdir_lib.prepare(workdir, self.command, ckpt_dir, lead=self.lead)
        self.cfg = cfg = self.configure(cfg)
        self.prepare()
        self.total = self.total_steps()
        self.ckpt = ckpt_lib.Checkpointer(ckpt_dir, save_every=cfg.checkpoint.save_every,
                                          keep=cfg.checkpoint.keep,
                                          async_save=cfg.checkpoint.async_save)
        data, field = self.data_fingerprint()
        resume.check(workdir, cfg, self.command, resuming=self.ckpt.latest_step() is not None,
                     data=data, data_field=field, lead=self.lead)
        self.stopped_by, self.step_done, self.metrics = "", None, {}
        # A finished workdir: say so (execute() returns its last metrics), load no model.
        self.complete = workdir_lib.finished_step(self.ckpt, self.total)
        if self.complete is not None:
            self.check_complete(self.complete)
            return
        self.build()
        workdir_lib.check_free_space(workdir, workdir_lib.tree_bytes(self.abstract_state()),
                                     cfg.checkpoint.keep, self.command)

    # ---- what a trainer says (set-up)
    def check_job(self, cfg):
        """Refuse a job this trainer cannot run, before anything is written."""

    def configure(self, cfg):
        """The config the run uses (read, never written: a copy where it differs)."""
        return cfg

    def prepare(self):
        """Set-up that needs no model (data plans, task files): runs before the resume check."""

    def total_steps(self) -> int:
        raise NotImplementedError

    def data_fingerprint(self) -> tuple[list, str]:
        """(resume.check's data fingerprint, the config field that names the data)."""
        raise NotImplementedError

    def check_complete(self, step: int):
        """A finished workdir's checks (e.g. that it holds this model)."""

    def build(self):
        """The model, optimizer, shardings and step functions."""
        raise NotImplementedError

    def abstract_state(self):
        raise NotImplementedError

    def init_state(self):
        raise NotImplementedError

    def restored(self, data_state):
        """Set the data position from a checkpoint's data state (None: a fresh run)."""

    def run_files(self):
        """Process 0's files beside the config (model_config.json, lora.json)."""

    def opened(self):
        """Set-up after the state exists: compiled steps, the trainer's own files."""

    def announce(self):
        """The banner printed before step 1."""

    # ---- what a trainer says (steps)
    def train_step(self, step: int) -> dict:
        """Step `step` (0-based); returns its metrics."""
        raise NotImplementedError

    def data_state(self):
        """What a checkpoint records of the data position."""
        return None

    def log_every(self) -> int:
        raise NotImplementedError

    def progress(self, m: dict) -> dict:
        """The progress bar's postfix of a step's metrics."""
        return {}

    def log_metrics(self, m: dict) -> dict:
        """A logged step's metrics (a trainer may add rates)."""
        return m

    def step_hooks(self) -> list[Hook]:
        """The trainer's own hooks, run after metrics and progress, before the checkpoint."""
        return []

    def stop_reason(self, done: int) -> str:
        """Why to stop after step `done` though no signal came ("" to go on)."""
        return ""

    def finish(self, last: int | None):
        """After the last step, before its checkpoint (a final eval)."""

    def release(self):
        """Resources to free before the checkpointer closes (worker processes)."""

    def close_files(self):
        """The trainer's own files (closed after the progress bar and metrics writer)."""

    def plot_title(self) -> str:
        return f"rossjax {self.command}"

    # ---- the scaffolding
    def start(self):
        """Restore the latest checkpoint or start fresh; save the config; open the files."""
        self.start_step, self.state, data_state = self.ckpt.restore_latest(
            self.abstract_state(), self.command)  # a damaged step: falls back
        if self.start_step is None:
            self.start_step, self.state = 0, self.init_state()
        self.restored(data_state)
        if self.lead:
            workdir_lib.save_config(self.workdir, self.cfg)
            self.run_files()
        self.opened()
        log = self.cfg.get("log") or {}
        self.writer = MetricsWriter(self.workdir, resume_step=self.start_step,
                                    wandb=log.get("wandb", ""), config=self.cfg.to_dict())
        self.announce()
        self.bar = Progress(self.total, initial=self.start_step, desc=self.desc)

    def hooks(self) -> list[Hook]:
        """After each step, in order: metrics, progress, the trainer's own, the checkpoint. Every
        row a step records is written before its checkpoint: a run lost after the save resumes
        past that step and would never write a row that came later (e.g. its eval)."""
        return [Hook(lambda i: self.writer.write(i.done, self.log_metrics(i.metrics)),
                     every=self.log_every(), last=True),
                Hook(lambda i: self.bar.update(1, **self.progress(i.metrics))),
                *self.step_hooks(),
                Hook(lambda i: self.ckpt.save(i.done, self.state, self.data_state()))]

    def fit(self):
        """Steps to the end, or to a stop request: checkpoint and stop (`stopped_by` says why)."""
        hooks, last = self.hooks(), None
        with ckpt_lib.PreemptionGuard(self.command) as guard:
            for step in range(self.start_step, self.total):
                self.metrics = self.train_step(step)
                info = StepInfo(step + 1, self.total, self.metrics)
                for h in hooks:
                    if h.due(info):
                        h.fn(info)
                self.step_done = info.done
                why = ((guard.signal_name or "SIGTERM") if ckpt_lib.any_process(guard.requested)
                       else self.stop_reason(info.done))
                if why:
                    self.ckpt.save(info.done, self.state, self.data_state(), force=True)
                    self.bar.write(f"rossjax {self.command}: {why} at step {info.done}; "
                                   f"checkpoint saved, exiting.")
                    self.stopped_by = why
                    return
                last = info.done
            self.finish(last)
            if last is not None:
                self.ckpt.save(last, self.state, self.data_state(), force=True)

    def stop_info(self) -> dict:
        """The result fields every trainer returns: the last finished step, whether (and why)
        it stopped early, and the run's length."""
        step = self.step_done if self.step_done is not None else self.start_step
        return {"step": step, "stopped": bool(self.stopped_by), "stopped_by": self.stopped_by,
                "total": self.total}

    def close(self):
        self.release()
        self.ckpt.close()
        for name in ("bar", "writer"):
            if hasattr(self, name):
                getattr(self, name).close()
        self.close_files()
        if hasattr(self, "writer"):
            write_plot(self.workdir, list(self.plot), out="metrics.png", title=self.plot_title())

    @classmethod
    def execute(cls, cfg, workdir: str, *args, **kwargs) -> dict:
        """Set up, train, close; `complete_result()` for a finished workdir, else `result()`."""
        with workdir_lib.unlock_at_end(workdir):  # the lock __init__ takes, however it ends
            trainer = cls(cfg, workdir, *args, **kwargs)
            try:
                if trainer.complete is not None:
                    return trainer.complete_result()
                trainer.start()
                trainer.fit()
            finally:
                trainer.close()
        return trainer.result()

    def complete_result(self) -> dict:
        raise NotImplementedError

    def result(self) -> dict:
        raise NotImplementedError


def stop_code(out: dict) -> int:
    """A stopped run's exit status: 130 after Ctrl-C (a shell's `&&` does not go on), else 0
    (SIGTERM and SIGHUP: a preempted job that saved is not a failure)."""
    return 130 if out.get("stopped_by") == "SIGINT" else 0
