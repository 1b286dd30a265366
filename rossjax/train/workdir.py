"""A run's workdir before step 1 (shared by `rossjax train` and `rossjax grpo`): is it writable,
is it free (locked for this run: rossjax/runlock.py), is there room for a checkpoint, stale
temporary checkpoint folders of a killed save removed, and the run's full config written beside
the checkpoints (config.json, and config.py that `--config=` reads back). Paths go through
etils.epath, so a workdir may be `gs://...`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pprint
import shutil
import socket
import sys

from etils import epath

from rossjax import runlock
from rossjax.errors import InputError
from rossjax.monitor import is_remote

STALE_GLOB = "*.orbax-checkpoint-tmp*"


def check_writable(workdir, command: str = ""):
    """One sentence (InputError; the CLI prefixes the command) when the workdir cannot be
    created or written to."""
    path = epath.Path(workdir)
    probe = path / f".rossjax-write-test-{socket.gethostname()}-{os.getpid()}"  # one per process
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise InputError(f"--workdir {workdir} is not writable ({why}); give "
                         f"a directory this user can write to.") from None


def tree_bytes(tree) -> int:
    """Bytes of the arrays (or shape/dtype structs) of a pytree: a checkpoint's size, about."""
    import jax
    import numpy as np

    return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree) if hasattr(x, "shape")))


def check_free_space(workdir, need: int, keep: int, command: str, *, free: int | None = None):
    """One sentence before step 1 when the workdir's disk cannot hold one checkpoint of `need`
    bytes (orbax writes the new step before deleting an old one); a note on stderr when it
    cannot hold the `keep` + 1 copies a long run reaches. Remote workdirs are not checked."""
    if is_remote(workdir):
        return
    if free is None:
        free = shutil.disk_usage(os.fspath(workdir)).free
    if free < need * 1.05:
        raise InputError(f"--workdir {workdir} has {_mb(free)} free but one "
                         f"checkpoint of this run takes about {_mb(need)}; free some space or "
                         f"give another --workdir.")
    if free < need * (keep + 1):
        print(f"rossjax {command}: note: --workdir {workdir} has {_mb(free)} free, less than the "
              f"{keep + 1} checkpoints of {_mb(need)} a run keeping {keep} may hold at once.",
              file=sys.stderr)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def clean_stale(checkpoint_dir) -> list[str]:
    """Remove temporary checkpoint folders a killed or failed save left (never a finished step)."""
    root = epath.Path(checkpoint_dir)
    if not root.exists():
        return []
    gone = []
    for p in sorted(root.glob(STALE_GLOB)):
        if p.is_dir():
            p.rmtree()
        else:
            p.unlink()
        gone.append(p.name)
    return gone


def lock(workdir, command: str, *, lead: bool):
    """Lock the workdir for this run (process 0 holds the lock for a multi-host job; every
    process stops when it is refused). LockHeld names the holder's host and pid."""
    import jax

    refused = None
    if lead:
        try:
            runlock.hold(workdir, f"rossjax {command}")
        except runlock.LockHeld as e:
            refused = e
    if jax.process_count() > 1:
        from rossjax.train.checkpoint import any_process

        if any_process(refused is not None) and refused is None:
            raise runlock.LockHeld(f"--workdir {workdir} is in use by another run (process 0's "
                                   f"log names it).")
    if refused is not None:
        raise refused


def release(workdir):
    """Release this process's lock on the workdir (after the run's last write)."""
    runlock.release(os.fspath(workdir))


@contextlib.contextmanager
def unlock_at_end(workdir):
    """Releases the lock a run's set-up took however the run ends (also a failed set-up)."""
    try:
        yield
    finally:
        release(workdir)


def prepare(workdir, command: str, checkpoint_dir, *, lead: bool):
    """The checks that need no model: writable workdir, locked for this run, stale temporary
    checkpoints (of a dead run, never of a live one: the lock comes first) removed."""
    check_writable(workdir, command)
    lock(workdir, command, lead=lead)
    if lead:
        gone = clean_stale(checkpoint_dir)
        if gone:
            print(f"rossjax {command}: removed {len(gone)} unfinished checkpoint folder(s) of an "
                  f"interrupted save: {', '.join(gone)}.", file=sys.stderr)


def save_config(workdir, cfg):
    """WORKDIR/config.json (the full config, overrides applied) and WORKDIR/config.py, which
    `--config=WORKDIR/config.py` reads back to rerun or inspect the run."""
    d = cfg.to_dict()
    if "resume_changes" in d:  # an acceptance is for the run that gave it (train/resume.py)
        d["resume_changes"] = ""
    root = epath.Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    write_text(root / "config.json", json.dumps(d, indent=1, sort_keys=True, default=str) + "\n")
    write_text(root / "config.py",
        '"""The full config of the run in this workdir (written at its start, overrides applied).\n'
        'Rerun or inspect it with --config=THIS_FILE."""\n\n'
        "import ml_collections\n\n\n"
        "def get_config():\n"
        f"    return ml_collections.ConfigDict({_literal(d)})\n")


def write_text(path, text: str) -> None:
    """A workdir file, replaced atomically; a local one never through a link planted there (the
    link is replaced, its target left alone: runlock.write_atomic)."""
    if is_remote(path):
        epath.Path(path).write_text(text)
    else:
        runlock.write_atomic(os.fspath(path), text.encode("utf-8"), what="a workdir file")


def _literal(d: dict) -> str:
    """A Python literal of the config dict (NaN/inf floats written as float('...'))."""
    text = pprint.pformat(d, indent=1, width=92, sort_dicts=True)
    for bad in ("nan", "inf"):
        text = text.replace(f": {bad},", f": float('{bad}'),").replace(f": -{bad},",
                                                                       f": float('-{bad}'),")
    return "\n        ".join(text.splitlines())


def finished_step(checkpointer, total: int) -> int | None:
    """The latest checkpoint step when it already reaches `total` (a finished run), else None."""
    last = checkpointer.latest_step()
    return last if last is not None and last >= total else None
