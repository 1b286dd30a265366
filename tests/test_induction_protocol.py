"""The AZR induction-task protocol: a task is (f, 10 inputs, a message); the solver sees 5
pairs + the message and is scored on the 5 hidden inputs. A lookup-table solver (which never
infers f) must score 0; the validity gate, the GRPO validity reward and eval-generator use it."""

import pytest

from rossjax.verify import induction_task as it, rewards
from rossjax.verify.induction import verify

PROG = "def f(a, b):\n    return a * b + 1\n"
INPUTS = [f"{a}, {a + 3}" for a in range(10)]


def gen_text(program=PROG, inputs=INPUTS, message="multiply, then add one"):
    msg = f"```message\n{message}\n```" if message is not None else ""
    return f"```python\n{program}```\n```inputs\n" + "\n".join(inputs) + f"\n```\n{msg}"


def _rec(task, answer):
    return {"task": task, "messages": [{"role": "user", "content": task["prompt"]},
                                       {"role": "assistant", "content": answer}]}


def test_lookup_solver_scores_zero_on_hidden_inputs():
    task = it.parse_generated_task(gen_text())
    assert it.check_task(task).passed is True
    st = it.solver_task(task, it.Protocol(), "t0")
    assert st["inputs"] == INPUTS[:5] and st["hidden_inputs"] == INPUTS[5:]
    # the solver's prompt holds the message and the 5 shown pairs, none of the hidden inputs
    assert "multiply, then add one" in st["prompt"] and "f(0, 3) = 1" in st["prompt"]
    assert not any(f"f({h})" in st["prompt"] for h in st["hidden_inputs"])
    table = it.lookup_answer(st)
    # the table reproduces every shown pair, but it is scored on the hidden ones: 0 of 5
    shown = {**st, "hidden_inputs": st["inputs"], "inputs": [], "hidden_outputs": None}
    assert verify(_rec(shown, table)).passed is True
    v = verify(_rec(st, table))
    assert v.passed is False and v.evidence.startswith("0/5"), v
    assert verify(_rec(st, f"```python\n{PROG}```")).passed is True
    # the old protocol (scored on the shown inputs) is refused, not silently passed
    leak = {**st, "hidden_inputs": st["inputs"], "hidden_outputs": None}
    assert verify(_rec(leak, table)).passed is None
    assert verify(_rec({k: v for k, v in st.items() if k != "hidden_inputs"}, table)).passed is None


def test_validity_gate_needs_ten_inputs_and_a_message():
    p = it.Protocol()
    assert it.check_task(it.parse_generated_task(gen_text(inputs=INPUTS[:9])), p).passed is False
    assert it.check_task(it.parse_generated_task(gen_text(message=None)), p).passed is False
    assert it.check_task(None, p).passed is False
    assert it.check_task(it.parse_generated_task(gen_text(inputs=INPUTS[:4])),
                         it.Protocol(n_inputs=4, n_visible=2)).passed is True
    # the GRPO validity reward reads the protocol the task source put on the record's task
    rec = {"task": {"protocol": {"n_inputs": 4, "n_visible": 2, "split": "first"}},
           "messages": [{"role": "assistant", "content": gen_text(inputs=INPUTS[:4])}]}
    assert rewards.score("validity", rec)[0] == 1.0
    assert rewards.score("validity", {**rec, "task": {}})[0] == 0.0   # default: 10 inputs
    assert rewards.score("validity", {"task": {}, "messages": [
        {"role": "assistant", "content": gen_text()}]})[0] == 1.0
    with pytest.raises(ValueError, match="n_visible"):
        it.Protocol(n_inputs=4, n_visible=4)


def test_seeded_split_is_disjoint_and_keyed_by_task_id():
    p = it.Protocol(split="seeded")
    task = {"inputs": INPUTS}
    vis, hid = it.split_inputs(task, p, "a")
    assert len(vis) == len(hid) == 5 and sorted(vis + hid) == sorted(INPUTS)
    assert it.split_inputs(task, p, "a") == (vis, hid)
    assert any(it.split_inputs(task, p, k)[0] != vis for k in "bcdefg")


def test_grpo_task_source_carries_the_protocol():
    from rossjax.train.rl import rollout

    src = rollout.TaskSource("gen:induction", induction={"n_inputs": 6, "n_visible": 3,
                                                         "split": "seeded"})
    t = src.next(1)[0]
    assert t["protocol"] == {"n_inputs": 6, "n_visible": 3, "split": "seeded"}
    assert "exactly 6" in t["prompt"] and "```message" in t["prompt"]


def test_eval_generator_scores_hidden_inputs(tmp_path, monkeypatch):
    from rossjax.cli import parse_config
    from rossjax.train.propel import eval_generator as ev

    texts = [gen_text(), gen_text(program="def f(a, b):\n    return a + 2 * b\n",
                                  inputs=[f"{a}, {a * a}" for a in range(10)]), "no task"]
    monkeypatch.setattr(ev, "_sample", lambda *a, **k: texts)
    c = parse_config(["--config=configs/eval_generator.py:runlocal"])[0]
    c.workdir, c.k, c.lo, c.hi = str(tmp_path), 2, 1.0, 1.0
    c.solver.kind = "lookup"   # the shown pairs, memorised: not one hidden input right
    out = ev.evaluate_generator(c)
    assert out["solve_counts"] == [0, 0, 0] and out["utility_rate"] == 0.0
    c.solver.kind = "oracle"
    out = ev.evaluate_generator(c)
    assert out["solve_counts"] == [2, 2, 0] and out["utility_rate"] == pytest.approx(2 / 3)
