"""On-policy distillation (multi-teacher, MOPD): the student samples, frozen teachers score.

Run:
  rossjax distill --config=configs/distill_onpolicy.py --config.model.path=STUDENT_HF_DIR \
      --config.distill.teachers.math=MATH_TEACHER_DIR --config.distill.teachers.code=CODE_TEACHER_DIR \
      --config.data.tasks=tasks.jsonl --workdir=runs/mopd
  rossjax distill --config=configs/distill_onpolicy.py:runlocal --workdir=/tmp/distill-local
  rossjax distill --config=configs/distill_onpolicy.py:continued --workdir=runs/mopd   # +200 steps

What it does (rossjax/train/rl/distill_trainer.py): each step the student samples
`grpo.group_size` completions for each of `grpo.contexts` tasks on GRPO's rollout engine; each
row goes to the teacher its task's `distill.route_field` names through `distill.routes`
(`distill.default` takes rows with no route; empty refuses them); each teacher scores its rows
in one forward pass at the sampling temperature; one update on the per-token reverse KL
`distill.loss` (`reverse_kl_sampled`: the sampled-token estimator, as a per-token advantage;
`reverse_kl_full`: the exact KL over the vocabulary, which runs the teachers again inside the
update). Teachers are Hugging Face (or `rossjax export --format orbax`) folders; their
tokenizer must be the student's (refused in one sentence otherwise), their architecture may
differ. `distill.tokenizers.NAME` names a teacher's tokenizer when its folder holds none.
Rewards (`reward.functions`) are measured, not trained on: they give the history its verdicts.
Every completion is appended to WORKDIR/history.jsonl with `teacher` and `teacher_logprobs`,
the input of ROSS relearning on MOPD rollouts (rossjax curate, as for GRPO's history).

`:continued` is the paper's Continued-MOPD control: resume the upstream run in its own
workdir (the run's length is the one field a resume may change, train/resume.py) for 200 more
steps than `grpo.steps`; its learning rate is constant, so the extra steps run at the same rate.
Keep a copy of the upstream workdir first (`cp -r`) if ROSS should relearn its history as it
stood: the continued run appends to history.jsonl and rotates the checkpoints (`checkpoint.keep`).

`:runlocal`: the tiny random Qwen2 student and one tiny teacher, ASCII tokenizer, `gen:contains`
tasks, 4 x 4 completions of 16 tokens, 20 steps (~50 s on a 2-core CPU). Its default teacher
is random (`preset:tiny_qwen2`, seeded apart) and almost uniform, as the student is, so the
KL stays near 0: the machinery, not learning. For learning, train the teacher on the shipped
task first (docs/distill.md gives the three commands and the 3-seed measurement):
  rossjax grpo --config=configs/grpo_verifier.py:runlocal --workdir=/tmp/teacher-run
  rossjax export --checkpoint /tmp/teacher-run --format hf --dtype float32 /tmp/teacher
  rossjax distill --config=configs/distill_onpolicy.py:runlocal \
      --config.distill.teachers.contains=/tmp/teacher --workdir=/tmp/distill
"""

from rossjax.configs import common

CONTINUED_STEPS = 200            # the paper's Continued MOPD: 200 more steps
RUNLOCAL_CONTINUED_STEPS = 10    # the same control in miniature (:runlocal,continued)


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal", "continued"), "distill_onpolicy.py")
    c = common.grpo_config()
    c.run_name = "distill-onpolicy"
    c.data.tasks = "gen:arith"
    c.reward.functions = ("verifier",)
    c.reward.weights = (1.0,)
    c.grpo.steps = 500
    c.grpo.contexts = 64             # prompts a step
    c.grpo.group_size = 4            # completions per prompt
    c.grpo.max_new_tokens = 512
    c.grpo.temperature = 1.0         # the teachers score at the same temperature
    c.optim.peak_lr = c.optim.end_lr = 1e-6
    c.distill = _section()
    c.distill.teachers = {"math": "", "code": ""}   # name -> teacher folder
    c.distill.tokenizers = {"math": "", "code": ""}  # name -> tokenizer spec ("": the folder's)
    c.distill.routes = {"math": "math", "code": "code"}  # task domain -> teacher name
    if "runlocal" in variants:
        common.runlocal_grpo(c, steps=20, max_new_tokens=16, save_every=10)
        c.data.tasks = "gen:contains"
        c.reward.functions, c.reward.weights = ("contains",), (1.0,)
        c.distill.teachers = {"contains": "preset:tiny_qwen2"}
        c.distill.tokenizers = {"contains": ""}
        c.distill.routes = {"contains": "contains"}
        c.optim.peak_lr = c.optim.end_lr = 3e-3
    if "continued" in variants:
        c.grpo.steps += RUNLOCAL_CONTINUED_STEPS if "runlocal" in variants else CONTINUED_STEPS
    return c


def _section():
    from ml_collections import config_dict

    d = config_dict.ConfigDict()
    d.route_field = "domain"
    d.default = ""                   # the teacher of rows whose field has no route ("": refuse)
    d.loss = "reverse_kl_sampled"    # or reverse_kl_full (rossjax/train/rl/distill.py)
    return d
