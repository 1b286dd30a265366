"""GRPO compiles its update and log-prob programs once (issue 42 item 6): prompts whose lengths
differ from step to step (as PROPEL Math's, whose examples are drawn per prompt) keep one batch
length S, so steps 2..N reuse step 1's programs instead of compiling them again."""

import json

import jax

from rossjax.train.rl import grpo, grpo_step

# chatml + ASCII tokens: a prompt of k characters is k + 19 tokens; with 8 new tokens the rows
# are 580, 600 and 620 long: three batch lengths when S was rounded to 16 (592, 608, 624), one
# bucket (640) for grpo_step.batch_length.
_OVERHEAD, _NEW = 19, 8
_TOTALS = (600, 620, 580)


def _config(tasks: str):
    c = grpo.default_config()
    c.tokenizer = "ascii"
    c.model.preset = "tiny_qwen2"
    c.model.dtype = "float32"
    c.data.tasks = tasks
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size, c.grpo.max_new_tokens = 3, 1, 2, _NEW
    c.grpo.beta = 0.05          # the reference log-probs: the log-prob program runs every step
    c.grpo.loss_chunk = 32
    c.reward.functions = ("contains",)
    c.reward.workers = 0
    c.mesh.num_devices = 1
    c.checkpoint.async_save = False
    c.checkpoint.save_every = 1000
    return c


def test_batch_length_buckets_and_never_shrinks():
    assert [grpo_step.batch_length(n) for n in (1, 16, 17, 250, 580, 620, 1040, 1104)] == \
        [16, 16, 32, 256, 640, 640, 1152, 1152]
    assert grpo_step.batch_length(580, floor=1152) == 1152
    for n in range(1, 5000, 7):
        s = grpo_step.batch_length(n)
        assert n <= s <= max(n + 15, n * 1.125) and s % 16 == 0


def test_steps_after_the_first_compile_no_update_or_logprob_program(tmp_path, monkeypatch):
    tasks = tmp_path / "tasks.jsonl"
    with open(tasks, "w") as f:
        for i, n in enumerate(_TOTALS):
            f.write(json.dumps({"id": f"t{i}", "prompt": "a" * (n - _OVERHEAD - _NEW),
                                "reference": "a"}) + "\n")
    compiles, step_of = [], {"now": 0}
    listener = lambda event, secs, **kw: compiles.append((step_of["now"], kw.get("fun_name"))) \
        if event == "/jax/core/compile/backend_compile_duration" else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    sizes, lengths = [], []
    orig = grpo.GRPOTrainer.train_step

    def train_step(self, step):
        step_of["now"] = step + 1
        m = orig(self, step)
        fns = self.run.fns
        sizes.append({f"{name}[{sh}]": getattr(fns, name)[sh]._cache_size()
                      for name in ("_update", "_logp") for sh in (False, True)})
        lengths.append(self.run.seq_len)
        return m

    monkeypatch.setattr(grpo.GRPOTrainer, "train_step", train_step)
    try:  # a StepCache of its own: no programs from another test in this process
        grpo.run(_config(str(tasks)), str(tmp_path / "run"), step_cache=grpo.StepCache())
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert lengths == [640, 640, 640], lengths
    later = [name for step, name in compiles if step >= 2]
    assert sizes[0] == sizes[-1], (f"steps 2..3 compiled update/log-prob programs again: cache "
                                   f"sizes {sizes}; their compiles: {later}")
    assert sum(sizes[0].values()) == 2, sizes  # one update, one log-prob program
