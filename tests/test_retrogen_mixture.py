"""RetroGen's Public-Baseline mixture slot (issue 38 item 2): `configs/mixture.py:public_baseline`
puts a user's public tool-use SFT data in the 80% the three RetroGen domains hold, on the paper
mixture's budget, so both mixtures train on the same token count."""

import json

import numpy as np
from test_mixture import _curated_dir

from rossjax.configs import mixture as mix_config
from rossjax.curate.mixture import run


def test_public_baseline_replaces_the_agentic_80_percent_on_the_same_budget(tmp_path):
    paper, public = mix_config.get_config(), mix_config.get_config("public_baseline")
    assert sorted(public.sources) == ["general", "public_tool_use"]
    assert public.budget_tokens == paper.budget_tokens and public.max_length == paper.max_length
    agentic = sum(paper.sources[k].share for k in ("science", "finance", "legal"))
    assert public.sources.public_tool_use.share == agentic == 0.8
    assert public.sources.general.share == paper.sources.general.share
    rng = np.random.default_rng(0)
    totals = {}
    for name, cfg in (("paper", paper), ("public", public)):
        for k in cfg.sources:
            _curated_dir(tmp_path / f"{name}-{k}", k, rng.integers(20, 300, 120))
            cfg.sources[k].path = str(tmp_path / f"{name}-{k}")
        cfg.output, cfg.budget_tokens, cfg.progress = str(tmp_path / f"mix-{name}"), 8000, False
        run(cfg)
        rep = json.loads((tmp_path / f"mix-{name}" / "report.json").read_text())
        assert rep["within_tolerance"]
        totals[name] = sum(s["tokens"] for s in rep["sources"].values())
        if name == "public":
            assert abs(rep["sources"]["public_tool_use"]["achieved_share"] - 0.8) < 0.005
    assert abs(totals["paper"] - totals["public"]) <= 0.01 * 8000  # same token accounting
