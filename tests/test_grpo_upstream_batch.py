"""configs/grpo_verifier.py is the paper's upstream RL run: 128 prompts x 8 rollouts, update
batch 256, asynchronous rollouts; `:runlocal` stays small (a CPU run) and synchronous."""

from rossjax.configs import grpo_verifier
from rossjax.train.rl import grpo


def test_paper_batch_and_async_rollouts():
    c = grpo_verifier.get_config()
    grpo.check_config(c)
    g = c.grpo
    assert (g.contexts, g.group_size) == (128, 8)
    rows = g.contexts * g.group_size
    assert (g.minibatch if g.minibatch > 0 else rows // g.minibatches) == 256
    assert g.async_sampling is True and g.dynamic_sampling is False
    assert g.is_mode != "none"   # the off-policy gap of async sampling is corrected
    doc = grpo_verifier.__doc__
    assert "128 prompts x 8 rollouts" in doc and "minibatches of 256" in doc


def test_runlocal_small_and_synchronous():
    c = grpo_verifier.get_config("runlocal")
    grpo.check_config(c)
    assert c.grpo.contexts * c.grpo.group_size <= 32   # a CPU run, not the 1,024 rows
    assert c.grpo.async_sampling is False
