"""Orbax checkpoints of a training run, and saves triggered by SIGTERM (TPU VM preemption) or
SIGHUP (the terminal or SSH session that started the run went away).

A checkpoint step holds two items:
  * `state`: the train-state pytree (params, optimizer state, step, RNG, guard counters), saved
    sharded and asynchronously where orbax allows;
  * `data`: the data iterator's state as JSON (bytes are base64-encoded), so a resumed run
    reads exactly the batches the interrupted one would have read next.
Shared by SFT and GRPO; nothing here knows what the state contains. The directory may be
`gs://...` (etils.epath; orbax writes there itself).
"""

from __future__ import annotations

import base64
import json
import os
import signal

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

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

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def should_save(self, step: int) -> bool:
        return step % self.save_every == 0

    def save(self, step: int, state, data_state=None, *, force: bool = False) -> bool:
        if not force and not self.should_save(step):
            return False
        if step in (self._mngr.all_steps() or []):
            return False
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=ocp.args.JsonSave(encode_data_state(data_state)))
        return bool(self._mngr.save(step, args=args, force=True))

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

    def wait(self):
        self._mngr.wait_until_finished()

    def close(self):
        self._mngr.wait_until_finished()
        self._mngr.close()


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
    """Turns SIGTERM and SIGHUP into a flag the training loop polls, so it can save and exit
    cleanly (`signal_name` says which came first)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.requested = False
        self.signal_name = ""
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

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        return False


def any_process(flag: bool) -> bool:
    """True on every process if `flag` is True on any (all hosts must agree to save together)."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array([flag], np.int32))))
