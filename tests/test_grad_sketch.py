"""LM-head gradient sketches (`rossjax extract --config.kind=grad_sketch`): the sketch is
A^T G B of the autodiff gradient of each row's mean next-token NLL, the store reads back by id,
and `rossjax select --config.method=gradient` selects on it."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax import cli
from rossjax.models import forward, get_preset, init_params
from rossjax.models.transformer import lm_head
from rossjax.probes import grad_sketch
from rossjax.probes.store import open_store
from rossjax.resources import config_path


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny_qwen2")
    return cfg, init_params(cfg, jax.random.PRNGKey(0))


def _reference(cfg, params, toks, span_sets, a, b):
    """A^T G B per target set, G the autodiff gradient of the mean NLL w.r.t. the LM head."""
    toks = jnp.asarray([toks], jnp.int32)
    n = toks.shape[1]
    logits, hidden = forward(cfg, params, toks, hidden_layers=(cfg.n_layers,))
    h = hidden[cfg.n_layers][0]
    w = lm_head(cfg, params).astype(jnp.float32)
    np.testing.assert_allclose(h @ w, logits[0], rtol=1e-5, atol=1e-5)  # logits are H W
    nxt = jnp.roll(toks[0], -1)
    out = []
    for spans in span_sets:
        targets = set(range(1, n)) if spans is None else {t for s, e in spans
                                                          for t in range(max(s, 1), e)}
        mask = jnp.asarray([p + 1 in targets for p in range(n)], jnp.float32)  # p predicts p + 1

        def loss(w, mask=mask):
            lp = jax.nn.log_softmax(h @ w, axis=-1)
            return -(jnp.take_along_axis(lp, nxt[:, None], 1)[:, 0] * mask).sum() / mask.sum()

        g = np.asarray(jax.grad(loss)(w), np.float64)
        out.append((a.astype(np.float64).T @ g @ b.astype(np.float64)).reshape(-1))
    return out


def test_sketch_is_the_projected_autodiff_gradient(model):
    cfg, params = model
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, 256, n).tolist() for n in (5, 12, 16)]   # one length bucket
    spans = [[(1, 5)], [(3, 6), (9, 12)], [(10, 16)]]
    a, b = grad_sketch.projections(cfg.d_model, cfg.vocab_size, 4, 8, seed=3)
    want = [_reference(cfg, params, rows[i], (None, spans[i]), a, b) for i in range(3)]
    for j, sp in enumerate((None, spans)):
        got = np.zeros((3, 32))
        for idx, sk in grad_sketch.sketches(cfg, params, rows, sp, k1=4, k2=8, seed=3,
                                            batch_tokens=64):
            got[idx] = sk
        for i in range(3):
            np.testing.assert_allclose(got[i], want[i][j], rtol=1e-4, atol=1e-6)


def test_extract_grad_sketch_then_select_gradient(tmp_path, capsys):
    rng = np.random.default_rng(1)
    src, pool = tmp_path / "rows.jsonl", tmp_path / "pool.jsonl"
    with open(src, "w") as f, open(pool, "w") as g:
        for k in range(12):
            f.write(json.dumps({"id": f"r{k}", "input_ids": rng.integers(1, 256, 8 + k).tolist()}) + "\n")
            g.write(json.dumps({"id": f"r{k}", "task": {"id": f"p{k}"}, "verifier": {"passed": True},
                                "messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": f"step {k}."}]}) + "\n")
    out = tmp_path / "sk"
    base = ["extract", f"--config={config_path('extract.py')}", f"--config.input={src}",
            f"--config.output={out}", "--config.kind=grad_sketch", "--config.sketch.k1=4",
            "--config.sketch.k2=4"]
    assert cli.main(base) == 0
    st = open_store(str(out))
    assert st.manifest["kind"] == "grad_sketch" and st.read(grad_sketch.LAYER).shape == (12, 16)
    assert cli.main(base) == 0            # a finished store with the same settings is kept
    capsys.readouterr()
    assert cli.main(base[:-1] + ["--config.sketch.k2=8"]) == 2
    assert "other settings" in capsys.readouterr().err
    assert cli.main(base[:-3] + ["--config.kind=grads"]) == 2
    sel = tmp_path / "sel"
    assert cli.main(["select", f"--config={config_path('select_routes.py')}", f"--config.input={pool}",
                     f"--config.output={sel}", "--config.budget=4", "--config.method=gradient",
                     "--config.compare=random", "--config.plot=False", "--config.progress=False",
                     f"--config.gradient_store={out}"]) == 0
    rep = json.load(open(sel / "report.json"))
    assert rep["method"] == "gradient" and len(rep["selected_ids"]) == 4
