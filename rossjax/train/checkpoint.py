"""Orbax checkpoints of a training run, and saves triggered by SIGTERM (TPU VM preemption),
SIGHUP (the terminal or SSH session that started the run went away) or a first Ctrl-C.

A checkpoint step holds two items:
  * `state`: the train-state pytree (params, optimizer state, step, RNG, guard counters), saved
    sharded and asynchronously where orbax allows;
  * `data`: the data iterator's state as JSON (bytes are base64-encoded), so a resumed run
    reads exactly the batches the interrupted one would have read next.
Shared by SFT and GRPO; nothing here knows what the state contains. The directory may be
`gs://...` (etils.epath; orbax writes there itself).

Integrity: once orbax has finished a step (the next save, `wait()` or `close()`), process 0
writes `N/rossjax_checksums.json`, the sha256 of every file of the step. `restore_latest`
verifies it, restores, and checks that every float of the state is finite; a step that fails
any of these is moved to `bad-checkpoints/` beside the checkpoint folder, with a sentence, and
the previous step is tried. `check_resumed_step` does the same for a step whose first trained
step gives a non-finite loss, and stops the run (the rerun resumes from the previous step).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import math
import os
import signal
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rossjax import checksums

# The model-folder format (model_config.json, params/) is the models package's; workdirs use it too.
from rossjax.errors import InputError
from rossjax.models.orbax_folder import (  # noqa: F401
    read_model_config,
    restore_params,
    save_params,
    shape_mismatch,
    write_model_config,
)


def encode_data_state(state):
    """Iterator state (bytes, str or JSON-able dict) -> JSON-able dict."""
    if state is None:
        return {"kind": "none"}
    if isinstance(state, (bytes, bytearray)):
        return {"kind": "bytes", "b64": base64.b64encode(bytes(state)).decode("ascii")}
    return {"kind": "json", "value": state}


def decode_data_state(obj):
    if obj is None or obj.get("kind") == "none":
        return None
    if obj["kind"] == "bytes":
        return base64.b64decode(obj["b64"])
    return obj["value"]


MANIFEST = "rossjax_checksums.json"
SET_ASIDE = "bad-checkpoints"


class CheckpointError(InputError):
    """No checkpoint of a workdir can be resumed, or the resumed one gave a non-finite step."""


def item_handlers():
    """Handlers by item name, so a fresh manager can read metadata before any save or restore."""
    return {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}


class Checkpointer:
    """Save every `save_every` steps (plus forced saves), keep the last `keep`, restore exactly."""

    def __init__(self, directory: str, *, save_every: int = 1000, keep: int = 3,
                 async_save: bool = True):
        self.directory = (epath.Path(directory) if "://" in os.fspath(directory)
                          else epath.Path(os.path.abspath(directory)))
        self.save_every = max(int(save_every), 1)
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=max(int(keep), 1), create=True,
            enable_async_checkpointing=bool(async_save))
        self._mngr = ocp.CheckpointManager(self.directory, options=opts, item_handlers=item_handlers())
        self._unsealed: list[int] = []   # saved by this process, checksums not written yet
        self.restored_step: int | None = None   # set by restore_latest until the first step
        self.log = sys.stderr

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def step_dir(self, step: int) -> epath.Path:
        return self.directory / str(int(step))

    def _seal(self):
        """Checksum manifests of the steps this process saved, once orbax has finished them."""
        if not self._unsealed:
            return
        self._mngr.wait_until_finished()
        if jax.process_index() == 0:
            for step in self._unsealed:
                d = self.step_dir(step)
                if d.exists() and not (d / MANIFEST).exists():  # gone: max_to_keep deleted it
                    files = checksums.digest_folder(d, exclude=(MANIFEST,))
                    tmp = d / (MANIFEST + ".tmp")
                    tmp.write_text(json.dumps({"algorithm": "sha256", "files": files}))
                    tmp.replace(d / MANIFEST)
        self._unsealed = []

    def verify(self, step: int) -> bool:
        """True when step `step` matches its checksum manifest; False when it has none (saved by
        a run killed before it was sealed, or by an older rossjax); ChecksumError otherwise."""
        d = self.step_dir(step)
        man = d / MANIFEST
        if not man.exists():
            return False
        try:
            files = json.loads(man.read_text())["files"]
        except (ValueError, KeyError, TypeError):
            raise checksums.ChecksumError(f"checkpoint {self.directory} step {step}: {man} is not "
                                          f"a readable checksum manifest.") from None
        checksums.verify_folder(d, files, what=f"checkpoint step {step}")
        return True

    def should_save(self, step: int) -> bool:
        return step % self.save_every == 0

    def save(self, step: int, state, data_state=None, *, force: bool = False) -> bool:
        if not force and not self.should_save(step):
            return False
        if step in (self._mngr.all_steps() or []):
            return False
        self._seal()
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=ocp.args.JsonSave(encode_data_state(data_state)))
        saved = bool(self._mngr.save(step, args=args, force=True))
        if saved:
            self._unsealed.append(int(step))
        return saved

    def check_compatible(self, step: int, abstract_params, *, key: str = "params"):
        """Raise ValueError (one sentence) if stored params differ in names or shapes."""
        meta = self._mngr.item_metadata(step)["state"]
        tree = getattr(meta, "tree", meta)
        if key not in tree:
            raise InputError(f"checkpoint {self.directory} step {step} holds no {key!r} item.")
        msg = shape_mismatch(self.directory, step, tree[key], abstract_params)
        if msg:
            raise InputError(msg)

    def restore(self, step: int, abstract_state):
        """(state, data_state) for `step`; `abstract_state` leaves carry shape, dtype, sharding."""
        if "params" in abstract_state:
            self.check_compatible(step, abstract_state["params"])
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                  data=ocp.args.JsonRestore())
        try:
            out = self._mngr.restore(step, args=args)
        except ValueError as e:
            raise InputError(f"checkpoint {self.directory} step {step} does not fit this run: "
                             f"{str(e).splitlines()[0]}") from None
        return out["state"], decode_data_state(out["data"])

    def restore_latest(self, abstract_state, command: str):
        """(step, state, data_state) of the newest step that verifies, restores and holds only
        finite numbers, or (None, None, None) for an empty folder. A step that fails is set aside
        with a sentence and the one before it tried; CheckpointError when none is left. A
        checkpoint of another model (names or shapes differ: InputError) is not a damaged one
        and is raised as it is."""
        tried = []
        while (step := self.latest_step()) is not None:
            out, why = self._try_restore(step, abstract_state)
            if not any_process(why is not None):  # every process agrees before any returns
                if out[0] is False and jax.process_index() == 0:
                    print(f"rossjax {command}: note: checkpoint step {step} has no checksum "
                          f"manifest (saved by a run stopped before it was sealed, or by an "
                          f"older rossjax); restored unverified.", file=self.log)
                self.restored_step = step
                return step, out[1], out[2]
            tried.append(step)
            where = self.set_aside(step)
            prev = self.latest_step()
            if jax.process_index() == 0:
                print(f"rossjax {command}: checkpoint step {step} of {self.directory} is damaged: "
                      f"{why or 'another process could not restore it'}; moved it to {where} and "
                      + (f"falling back to step {prev}." if prev is not None
                         else "no earlier checkpoint is left."), file=self.log)
        if tried:
            raise CheckpointError(f"no checkpoint in {self.directory} can be resumed (steps "
                                  f"{', '.join(map(str, tried))} are damaged and were moved to "
                                  f"{self.directory.parent / SET_ASIDE}); give a new --workdir "
                                  f"or move them back to inspect them.")
        return None, None, None

    def _try_restore(self, step: int, abstract_state):
        """((sealed, state, data_state), None) or (None, why it is damaged)."""
        try:
            sealed = self.verify(step)
        except checksums.ChecksumError as e:
            return None, str(e).removeprefix(f"checkpoint step {step}: ").rstrip(".")
        try:
            if "params" in abstract_state:
                self.check_compatible(step, abstract_state["params"])
        except InputError:  # another model: the user's to fix, not a damaged step
            raise
        except Exception as e:  # noqa: BLE001
            return None, f"it does not restore (its metadata: {type(e).__name__})"
        try:
            state, data_state = self.restore(step, abstract_state)
        except InputError:
            if sealed:  # intact files that do not fit this run's shapes or dtypes
                raise
            return None, "it does not restore (an unsealed step, likely cut short)"
        except Exception as e:  # noqa: BLE001 - whatever damaged files raise
            return None, f"it does not restore ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        bad = non_finite(state)
        if bad is not None:
            return None, f"its state holds non-finite values ({bad})"
        return (sealed, state, data_state), None

    def set_aside(self, step: int) -> epath.Path:
        """Move step folder `step` out of the checkpoint folder (kept for inspection, never
        resumed or overwritten again); returns where it went."""
        self._mngr.wait_until_finished()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        dest = self.directory.parent / SET_ASIDE / f"{int(step)}-{stamp}"
        if jax.process_index() == 0:
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.step_dir(step).rename(dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"rossjax-set-aside-{step}")
        self._mngr.reload()
        return dest

    def check_resumed_step(self, step: int, loss: float, command: str):
        """After the first step trained from a restored checkpoint: a non-finite loss means that
        checkpoint is damaged in a way its checksums could not see (written wrong): set it
        aside and stop with a sentence; the rerun resumes from the step before it."""
        if self.restored_step is None or step != self.restored_step:
            return
        bad = self.restored_step
        self.restored_step = None
        if math.isfinite(float(loss)):
            return
        where = self.set_aside(bad)
        prev = self.latest_step()
        then = f"from step {prev}" if prev is not None else "from the start"
        raise CheckpointError(f"the first step after resuming from checkpoint step {bad} gave a "
                              f"non-finite loss, so that checkpoint is damaged; it was moved to "
                              f"{where}; rerun `rossjax {command}` with the same --workdir to "
                              f"resume {then}.")

    def wait(self):
        self._mngr.wait_until_finished()
        self._seal()

    def close(self):
        self._mngr.wait_until_finished()
        self._seal()
        self._mngr.close()


def non_finite(state) -> str | None:
    """Where a pytree holds a NaN or infinity (its first such leaf's path), or None."""
    import jax.numpy as jnp

    leaves = [(jax.tree_util.keystr(k), x) for k, x in jax.tree_util.tree_leaves_with_path(state)
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not leaves:
        return None
    flags = jax.device_get(jax.jit(lambda xs: jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]))(
        [x for _, x in leaves]))
    bad = [k for (k, _), ok in zip(leaves, np.asarray(flags)) if not ok]
    return f"{bad[0]}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else "") if bad else None


def write_lora_manifest(path: str, *, rank: int, alpha: float, targets, base_source: str,
                        base_path: str, seed: int):
    """lora.json beside model_config.json: what `rossjax export` needs to merge the adapters a
    LoRA run checkpoints back into its base (where the base came from, alpha / rank)."""
    base = base_path if not base_path or "://" in base_path else os.path.abspath(base_path)
    (epath.Path(path) / "lora.json").write_text(json.dumps(
        {"rank": int(rank), "alpha": float(alpha), "targets": list(targets),
         "base_source": base_source, "base_path": base, "seed": int(seed)}, indent=1))


def read_lora_manifest(path: str):
    """The LoRA manifest of a run dir, or None for a full-parameter run."""
    file = epath.Path(path) / "lora.json"
    if not file.exists():
        return None
    d = json.loads(file.read_text())
    missing = [k for k in ("rank", "alpha", "base_source", "base_path", "seed") if k not in d]
    if missing:
        raise InputError(f"{file}: field {missing[0]!r} is missing.")
    return d


class PreemptionGuard:
    """Turns SIGTERM, SIGHUP and the first SIGINT (Ctrl-C) into a flag the training loop polls,
    so it can save and exit cleanly (`signal_name` says which came first). After that Ctrl-C a
    second one ends the process at once (the default action: no save; the checkpoints already
    written stay), whatever the main thread is blocked in."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self, command: str = ""):
        self.requested = False
        self.signal_name = ""
        self.command = command
        self._old = {}

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handler, rely on periodic saves
                pass
        return self

    def _handle(self, signum, frame):
        self.requested = True
        self.signal_name = self.signal_name or signal.Signals(signum).name
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            # os.write, not print: the handler may interrupt a write to stderr (tqdm's bar)
            os.write(2, (f"\nrossjax {self.command or 'run'}: Ctrl-C: stopping after the step in "
                         f"progress with a checkpoint; Ctrl-C again stops at once without "
                         f"saving.\n").encode())

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        return False


@contextlib.contextmanager
def ctrl_c_blocked():
    """Processes started inside (GRPO's reward workers) never see a terminal's Ctrl-C, which
    reaches its whole process group: SIGINT is blocked while they start and they inherit the
    mask, so the trainer alone decides how the run stops. A Ctrl-C meanwhile waits, not lost."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def any_process(flag: bool) -> bool:
    """True on every process if `flag` is True on any (all hosts must agree to save together)."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array([flag], np.int32))))
