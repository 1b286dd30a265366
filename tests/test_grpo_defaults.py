"""The upstream GRPO recipe's defaults are the paper's (configs/grpo_verifier.py)."""

import re

import pytest

from rossjax import cli
from rossjax.configs import grpo_verifier
from rossjax.train.rl import grpo


@pytest.mark.parametrize("variant", ["", "runlocal"])
def test_paper_defaults(variant):
    c = grpo_verifier.get_config(variant)
    grpo.check_config(c)
    g = c.grpo
    assert c.optim.weight_decay == 0.1
    assert (g.is_mode, g.is_how) == ("token", "mask")  # IcePop: masked outside the band
    assert 0 < g.is_low < 1 < g.is_high                # two-sided
    assert g.advantages == "mean"
    # the loss as before the registries: PPO-clip + k3, no DAPO filtering or penalty
    assert (g.policy_loss, g.kl, g.agg) == ("ppo_clip", "k3", "token_mean")
    assert (g.dynamic_sampling, g.overlong_filter, g.overlong_buffer) == (False, False, 0)
    rows = g.contexts * g.group_size
    minibatch = g.minibatch if g.minibatch > 0 else rows // g.minibatches
    assert g.num_iterations * rows // minibatch > 1    # several updates: clipping can bind


def test_doc_states_the_configured_response_length_and_batch():
    c = grpo_verifier.get_config()
    doc = grpo_verifier.__doc__
    m = re.search(r"\((\d+) contexts x (\d+) samples x (\d+) tokens\)", doc)
    assert m and tuple(map(int, m.groups())) == (c.grpo.contexts, c.grpo.group_size,
                                                 c.grpo.max_new_tokens)
    assert f"max_new_tokens` = {c.grpo.max_new_tokens}" in doc
    assert f"minibatches={c.grpo.minibatches}" in doc


@pytest.mark.parametrize("over, says", [
    ("--config.grpo.minibatches=3", "config.grpo.minibatches"),
    ("--config.grpo.is_low=1.5", "config.grpo.is_low"),
    ("--config.grpo.policy_loss=gpso", "config.grpo.policy_loss 'gpso' is not one of"),
    ("--config.grpo.kl=k4", "config.grpo.kl 'k4' is not one of k1, k2, k3, k3_unbiased"),
    ("--config.grpo.overlong_buffer=4096", "config.grpo.overlong_buffer 4096 must be in"),
    ("--config.grpo.max_refill_rounds=-1", "config.grpo.max_refill_rounds is -1"),
])
def test_bad_update_settings_are_one_sentence(over, says):
    c = cli.parse_config(["--config=configs/grpo_verifier.py:runlocal", over])[0]
    with pytest.raises(ValueError, match=says):
        grpo.check_config(c)
