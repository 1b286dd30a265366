"""The warm-up generator `:runlocal` SIL runs start from (rossjax/train/propel/warmup.py, issue 39
item 4): its demonstrations pass W, answer the very prompt the runlocal run poses, and fit the
runlocal token budget, so a model cloned on them writes tasks the solver is called on. (Training
it and the GRPO run take minutes here: measured in configs/propel_sil.py's docstring.)"""

import pytest

from rossjax.cli import parse_config
from rossjax.train.propel import warmup
from rossjax.train.rl import rollout
from rossjax.verify import induction_task, math_task


@pytest.mark.parametrize("math", [False, True])
def test_demonstrations_pass_w_and_fit_the_runlocal_budget(math):
    demos = warmup.demonstrations(math)
    assert len(set(demos)) == len(demos) >= 6
    for d in demos:
        if math:
            assert math_task.check_problem(math_task.parse_generated_problem(d)).passed, d
        else:
            assert induction_task.check_task(induction_task.parse_generated_task(d)).passed, d
    c = parse_config(["--config=configs/propel_sil.py:runlocal" + (",math" if math else "")])[0]
    assert c.tokenizer == "ascii" and c.template == "chatml"
    assert max(len(d) for d in demos) + 1 <= c.grpo.max_new_tokens  # ASCII: a token a char
    src = rollout.TaskSource(c.data.tasks, seed=c.data.seed, induction=c.data.get("induction"),
                             math=c.data.get("math"))
    assert warmup.prompt(math) == src.next(1)[0]["prompt"]
