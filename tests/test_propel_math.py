"""PROPEL Math as the paper runs it: the generator writes the problem only, references come from
two oracles that must agree 2 x 2 under math-verify, label-corpus and eval-generator run math
tasks with K solver trials (endpoint, fn and checkpoint solvers) and count them in their
reports; generator contexts are drawn, seeded, from example pools; Self-BLEU-3 matches NLTK's
sentence BLEU with smoothing method1 (Montahaei et al.)."""

import json
import random

import ml_collections
import pytest
from review_server import Reviewer

from rossjax.errors import ConfigError, InputError
from rossjax.train.propel import eval_generator as ev, solvers
from rossjax.train.rl import rollout
from rossjax.verify import generator_context, induction_task, math_oracle, math_task

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


# ----------------------------------------------------------------------------- oracle policy

def test_oracle_agreement_disagreement_failure():
    lab = math_oracle.agree([["so \\boxed{1/2}", "\\boxed{0.5}"],
                             ["\\boxed{\\frac{1}{2}}", "#### 0.5"]])
    assert lab.status == "agreed" and lab.reference == "1/2" and "all 4" in lab.reason
    lab = math_oracle.agree([["\\boxed{1/2}", "\\boxed{1/2}"], ["\\boxed{1/2}", "\\boxed{3}"]])
    assert lab.status == "disagreement" and lab.reference is None
    assert lab.reason.startswith("oracle disagreement: ") and "oracle b attempt 2 says '3'" in lab.reason
    lab = math_oracle.agree([["\\boxed{2}", "I think it is two"], ["\\boxed{2}", None]])
    assert lab.status == "failure" and lab.reference is None
    assert "oracle a attempt 2 gave no \\boxed{} final answer" in lab.reason
    assert "oracle b attempt 2 gave no answer (its request failed)" in lab.reason
    lab = math_oracle.agree([["\\boxed{2}", "\\boxed{2}"], ["\\boxed{2}", "\\boxed{@@}"]])
    assert lab.status == "failure" and "cannot be parsed" in lab.reason
    # a failure is reported before a disagreement: an answer that never came cannot agree
    assert math_oracle.agree([["\\boxed{1}", None], ["\\boxed{5}", "\\boxed{5}"]]).status == "failure"
    with pytest.raises(ValueError):
        math_oracle.agree([["\\boxed{1}"]])


def test_generator_writes_the_problem_only():
    t = math_task.parse_generated_problem("```problem\nFind x if 2x = 6.\n```\n\\boxed{3}")
    assert t == {"problem": "Find x if 2x = 6."}           # the generator's answer is not kept
    assert math_task.check_problem(t).passed
    for text, says in [("no block", "no ```problem block"),
                       ("```problem\nShow \\boxed{3} is x.\n```", "its own answer"),
                       ("```problem\n" + "x" * 5000 + "\n```", "characters")]:
        v = math_task.check_problem(math_task.parse_generated_problem(text))
        assert not v.passed and says in v.evidence
    st = math_task.solver_task("Find x if 2x = 6.", "p1", "3")
    assert st["reference"] == "3" and st["prompt"].endswith(math_task.SOLVER_INSTRUCTION)
    assert "reference" not in math_task.solver_task("Find x.", "p2")


# ----------------------------------------------------------------------------- contexts

def test_contexts_are_seeded_draws_from_the_pools(tmp_path):
    pool = [json.loads(x) for x in open(generator_context.shipped_pool("math"))]
    a = [t["prompt"] for t in rollout.TaskSource("gen:math_task", seed=3).next(6)]
    b = rollout.TaskSource("gen:math_task", seed=3).next(6)
    assert a == [t["prompt"] for t in b]                    # same seed and index: same examples
    assert [t["prompt"] for t in rollout.TaskSource("gen:math_task", seed=4).next(6)] != a
    for t in b:
        assert len(t["context"]) == 2 and len(set(t["context"])) == 2
        for ex in (p for p in pool if p["id"] in t["context"]):
            assert ex["problem"] in t["prompt"]
    assert len({tuple(t["context"]) for t in b}) > 1        # examples vary across tasks
    # a resumed source draws what the uninterrupted one drew
    src = rollout.TaskSource("gen:math_task", seed=3)
    src.set_state({"index": 4})
    assert [t["prompt"] for t in src.next(2)] == a[4:]
    # a user's pool file
    mine = tmp_path / "mine.jsonl"
    mine.write_text("\n".join(json.dumps({"id": f"u{i}", "problem": f"Compute {i} + {i}."})
                              for i in range(3)))
    t = rollout.TaskSource("gen:math_task", math={"examples": str(mine)}).next(1)[0]
    assert t["context"][0].startswith("u") and "Compute" in t["prompt"]
    t = rollout.TaskSource("gen:math_task", math={"context": "instruction"}).next(1)[0]
    assert t["prompt"] == math_task.INSTRUCTION and "context" not in t
    # bad pools: one sentence naming file, row and field
    bad = tmp_path / "bad.jsonl"
    for rows, says in [(['{"id": "x"}'], "row 1: field 'problem'"),
                       (['{"id": "x", "problem": "a"}', '{"id": "x", "problem": "b"}'], "repeats"),
                       (['{"id": "x", "problem": "a"}', "{oops"], "row 2: not JSON")]:
        bad.write_text("\n".join(rows))
        with pytest.raises(InputError, match=says):
            rollout.TaskSource("gen:math_task", math={"examples": str(bad)})
    with pytest.raises(ConfigError, match="n_examples is 4 but the pool"):
        rollout.TaskSource("gen:math_task", math={"examples": str(mine), "n_examples": 4})
    with pytest.raises(ConfigError, match="config.data.math.context"):
        rollout.TaskSource("gen:math_task", math={"context": "fewshot"})


def test_azr_context_and_the_shipped_pools_are_valid():
    # the default stays the one fixed instruction (the existing protocol)
    t = rollout.TaskSource("gen:induction").next(1)[0]
    assert t["prompt"] == induction_task.generator_prompt() and "context" not in t
    t = rollout.TaskSource("gen:induction", seed=1, induction={"context": "paper"}).next(1)[0]
    p = t["prompt"]
    assert induction_task.SEED_PROGRAM in p and "Reference 2:" in p and "Reference 3:" not in p
    assert "subprocess" in p and "eval" in p and "exactly 10 different inputs" in p
    assert t["protocol"]["n_inputs"] == 10 and len(t["context"]) == 2
    for ex in (json.loads(x) for x in open(generator_context.shipped_pool("induction"))):
        v = induction_task.check_task(ex)
        assert v.passed, (ex["id"], v.evidence)
    for ex in (json.loads(x) for x in open(generator_context.shipped_pool("math"))):
        assert math_task.check_problem({"problem": ex["problem"]}).passed, ex["id"]
        # every shipped answer parses and agrees with itself under the oracle policy
        box = f"\\boxed{{{ex['answer']}}}"
        assert math_oracle.agree([[box, box], [box, box]]).status == "agreed", ex["id"]


# ----------------------------------------------------------------------------- Self-BLEU

def test_self_bleu3_matches_nltk_method1():
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    rng = random.Random(1)
    words = "def f x return + * 1 2 s sorted".split()
    method1 = SmoothingFunction().method1
    for trial in range(4):
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0 if trial else 1, 14)))
                 for _ in range(12)]
        toks = [t.split() for t in texts]
        ref = [sentence_bleu(toks[:i] + toks[i + 1:], toks[i], weights=(1 / 3,) * 3,
                             smoothing_function=method1) for i in range(len(toks))]
        assert ev.self_bleu(texts) == pytest.approx(sum(ref) / len(ref), rel=1e-12, abs=1e-15)
        for i in range(3):
            assert ev.bleu(toks[i], toks[i + 1:]) == pytest.approx(
                sentence_bleu(toks[i + 1:], toks[i], weights=(1 / 3,) * 3,
                              smoothing_function=method1) if toks[i] else 0.0, rel=1e-12, abs=1e-15)
    # smoothing: a hypothesis sharing unigrams but no trigram is no longer 0
    assert ev.self_bleu(["a b c d", "a x b y"]) > 0 and ev.self_bleu(["a b", "c d"]) == 0.0


# ----------------------------------------------------------------------------- solvers

def _section(kind="endpoint", **kw):
    from rossjax.configs.label_corpus import solver_config

    s = solver_config(kind)
    for k, v in kw.items():
        if k.startswith("e_"):
            s.endpoint[k[2:]] = v
        else:
            s[k] = v
    return s


def _cfg():
    return ml_collections.ConfigDict(dict(max_new_tokens=8, temperature=1.0))


def test_endpoint_solver_k_trials_seeds_and_counts():
    def answer(rid, body):
        if "FAIL" in body["messages"][1]["content"]:
            return (400, {"error": {"message": "bad request"}})
        return f"\\boxed{{{body['seed'] % 2}}}"        # right on even seeds only
    task = math_task.solver_task("What is 2 - 2?", "t0", "0")
    with Reviewer(default=answer) as srv:
        s = solvers.Solver(_section(e_base_url=srv.url, e_model="solver", system=SYSTEM,
                                    e_workers=3), None, _cfg())
        out = solvers.trials(s, [task, None, math_task.solver_task("FAIL", "t2", "1")], 4, seed=10)
        assert out[0] == [True, False, True, False] and out[1] == [] and out[2] == [None] * 4
        seeds = sorted(b["seed"] for b in srv.bodies() if "2 - 2" in b["messages"][1]["content"])
        assert seeds == [10, 11, 12, 13]                    # K trials: K distinct requests
        assert all(b["messages"][0] == {"role": "system", "content": SYSTEM} for b in srv.bodies())
        # an oracle whose requests fail: the problem is invalid, and says which attempt failed
        s_b = solvers.Solver(_section(e_base_url=srv.url, e_model="b", system=SYSTEM), None, _cfg())
        fail = math_task.solver_task("FAIL", "t3")
        labs = solvers.oracle_labels([s_b, s_b], [None, fail, task], seed=0)
        assert labs[0] is None and labs[2].status == "disagreement"      # seeds differ: 0 vs 1
        assert labs[1].status == "failure" and labs[1].reason.startswith(
            "oracle failure: oracle a attempt 1 gave no answer (its request failed)")
        assert s_b.report()["trials"] == 2 * 2 * 2 and s_b.report()["no_answer"] == 4
    rep = s.report()
    assert rep["tasks"] == 2 and rep["trials"] == 8 and rep["no_answer"] == 4
    assert rep["endpoint"]["requests"] == 8 and "HTTP 400" in rep["errors"][0]
    with pytest.raises(ConfigError, match="extra_body sets 'seed'"):
        solvers.Solver(_section(e_model="m", e_extra_body='{"seed": 1}'), None, _cfg())
    with pytest.raises(ConfigError, match="config.solver.endpoint.model is empty"):
        solvers.check_section(_section())
    with pytest.raises(ConfigError, match="induction check"):
        solvers.Solver(_section("lookup"), None, _cfg()).answers([task], 1, 0)
    with pytest.raises(ConfigError, match="has none"):
        solvers.Solver(_section("oracle"), None, _cfg()).answers(
            [math_task.solver_task("x", "t")], 1, 0)
    assert solvers.trials(solvers.Solver(_section("oracle"), None, _cfg()), [task], 3) == [[True] * 3]


def bad_fn(task, k, seed):
    return ["\\boxed{1}"] * (k - 1)


def test_fn_solver_wrong_count_is_one_sentence():
    s = solvers.Solver(_section("fn", fn="test_propel_math:bad_fn"), None, _cfg())
    with pytest.raises(TypeError, match="must return a list of 3 texts"):
        s.answers([math_task.solver_task("x", "t0", "1")], 3, 0)


@pytest.mark.slow
def test_checkpoint_solver_on_math_tasks(tmp_path):
    tok = solvers.load_tokenizer("ascii", str(tmp_path))
    s = solvers.Solver(_section("model", preset="tiny_qwen2"), tok, _cfg())
    out = solvers.trials(s, [math_task.solver_task("What is 1 + 1?", "t0", "2")], 3, seed=0)
    assert len(out[0]) == 3 and all(x is False for x in out[0])   # a random model never boxes 2
    assert s.report()["trials"] == 3


# ----------------------------------------------------------------------------- label-corpus

PROBLEMS = {"agree": ("A box holds 3 rows of 4 eggs. How many eggs?", "12"),
            "disagree": ("What is 6 + 7?", "13"),
            "fail": ("What is 5 * 5?", "25")}


def _scripted(rid, body):
    """Oracles a and b and the solver, by model name; problems by their text."""
    text, model, j = body["messages"][1]["content"], body["model"], body["seed"]
    ans = next((a for p, a in PROBLEMS.values() if p in text), "7")
    if model == "oracle-b" and "6 + 7" in text:
        return "\\boxed{14}"
    if model == "oracle-a" and "5 * 5" in text and j % 2:
        return "I am not sure."
    if model == "solver":
        return f"\\boxed{{{ans}}}" if j % 4 == 0 else "\\boxed{-1}"   # 1 of 4 trials right
    return f"The answer is \\boxed{{{ans}}}."


def _endpoint_flags(url):
    flags = []
    for name, model in (("solver", "solver"), ("oracles.a", "oracle-a"), ("oracles.b", "oracle-b")):
        flags += [f"--config.{name}.kind=endpoint", f"--config.{name}.endpoint.base_url={url}",
                  f"--config.{name}.endpoint.model={model}", f"--config.{name}.system={SYSTEM}"]
    return flags


def test_label_corpus_math_with_endpoint_oracles(tmp_path, capsys):
    from rossjax.cli import main

    rows = [{"id": k, "problem": p, "group": "g"} for k, (p, _) in PROBLEMS.items()]
    rows.append({"id": "gives-away", "problem": "Show that \\boxed{4} is 2 + 2."})
    # a generator record: its own \boxed{99} is not the reference; the oracles' 7 is
    rows.append({"id": "run-s2-x-g1", "messages": [
        {"role": "user", "content": "write a problem"},
        {"role": "assistant", "content": "```problem\nWhat is 3 + 4?\n```\n\\boxed{99}"}],
        "rewards": {"probe_score": 0.4}, "source": {"step": 2}})
    pool = tmp_path / "pool.jsonl"
    pool.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "lc"
    with Reviewer(default=_scripted) as srv:
        assert main(["label-corpus", "--config=configs/label_corpus.py", "--config.domain=math",
                     f"--config.pool={pool}", f"--config.output={out}", "--config.tokenizer=ascii",
                     "--config.k=4", *_endpoint_flags(srv.url)]) == 0
        asked = srv.bodies()
    by = {r["id"]: r for r in map(json.loads, open(out / "labels.jsonl"))}
    assert list(by) == [r["id"] for r in rows]
    assert by["agree"]["valid"] == 1 and by["agree"]["reference"] == "12"
    assert by["agree"]["trials"] == [True, False, False, False] and by["agree"]["oracle"] == "agreed"
    assert by["run-s2-x-g1"]["reference"] == "7" and by["run-s2-x-g1"]["probe_score"] == 0.4
    assert by["disagree"]["valid"] == 0 and by["disagree"]["trials"] == []
    assert by["disagree"]["invalid_reason"].startswith("oracle disagreement: ")
    assert by["fail"]["invalid_reason"].startswith("oracle failure: oracle a attempt ")
    assert by["gives-away"]["oracle"] == "not asked" and "own answer" in by["gives-away"]["invalid_reason"]
    assert by["agree"]["family"] == "other" or by["agree"]["family"]
    rep = json.load(open(out / "report.json"))
    assert rep["domain"] == "math" and rep["valid"] == 2 and rep["k"] == 4
    assert rep["solver"]["trials"] == 2 * 4 and rep["solver"]["endpoint"]["requests"] == 8
    o = rep["oracles"]
    assert (o["agreed"], o["disagreement"], o["failure"]) == (2, 1, 1)
    assert o["a"]["trials"] == o["b"]["trials"] == 4 * 2         # 4 problems pass W, 2 attempts
    assert len(asked) == 8 + 16                                  # nothing asked twice or skipped
    assert rep["invalid"] == {k: by[k]["invalid_reason"] for k in ("disagree", "fail", "gives-away")}
    assert rep["band_rate"] == pytest.approx(2 / 5)              # 1 of 4 in [0.5, 1.5]
    printed = capsys.readouterr().out
    assert "8 solver trials" in printed and "16 oracle trials" in printed
    tasks = [json.loads(x) for x in open(out / "tasks.jsonl")]
    assert [t["reference"] for t in tasks] == ["12", "7"]
    inputs = [json.loads(x) for x in open(out / "inputs.jsonl")]
    assert "```problem\nWhat is 3 + 4?\n```" in inputs[-1]["text"] and "99" not in inputs[-1]["text"]


def test_label_corpus_math_bad_inputs(tmp_path, capsys):
    from rossjax.cli import main

    pool = tmp_path / "pool.jsonl"
    pool.write_text(json.dumps({"id": "a", "program": "def f(x): return x"}))
    base = ["label-corpus", "--config=configs/label_corpus.py", "--config.domain=math",
            f"--config.pool={pool}", f"--config.output={tmp_path / 'o'}", "--config.tokenizer=ascii",
            "--config.solver.kind=oracle"]
    assert main(base + ["--config.oracles.a.kind=oracle", "--config.oracles.b.kind=oracle"]) == 2
    assert "row 1: needs 'messages' (a generator record) or 'problem'" in capsys.readouterr().err
    assert main(base) == 2                                        # oracles: model without a path
    assert "config.oracles.a.path" in capsys.readouterr().err
    assert main(base[:2] + ["--config.domain=algebra", *base[3:]]) == 2
    assert "field 'domain'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- eval-generator

def oracle_fn(task, k, seed):
    """A programmatic oracle: the sum the problem asks for ("What is A + B?")."""
    a, b = task["problem"].removeprefix("What is ").removesuffix("?").split(" + ")
    return [f"\\boxed{{{int(a) + int(b)}}}"] * k


def other_oracle_fn(task, k, seed):
    # disagrees on 5 + 5 (a second model that errs)
    return ["\\boxed{11}"] * k if "5 + 5" in task["problem"] else oracle_fn(task, k, seed)


def solver_fn(task, k, seed):
    right = oracle_fn(task, 1, seed)[0]
    return [right if (seed + j) % 3 == 0 else "\\boxed{0}" for j in range(k)]


def test_eval_generator_math_with_programmatic_solvers(tmp_path, monkeypatch):
    from rossjax.cli import parse_config

    texts = ["```problem\nWhat is 2 + 3?\n```", "```problem\nWhat is 5 + 5?\n```",
             "no problem here", "```problem\nWhat is 4 + 4?\n```\n\\boxed{9}"]
    seen = {}

    def fake_sample(mc, params, tok, msgs, n, c, seed):
        seen["msgs"], seen["n"] = msgs, n
        return texts
    monkeypatch.setattr(ev, "_sample", fake_sample)
    monkeypatch.setattr(ev, "_model", lambda *a: (None, None))
    c = parse_config(["--config=configs/eval_generator.py:runlocal", "--config.domain=math",
                      "--config.num_tasks=4", "--config.k=3", "--config.solver.kind=fn",
                      "--config.solver.fn=test_propel_math:solver_fn", "--config.oracles.a.kind=fn",
                      "--config.oracles.a.fn=test_propel_math:oracle_fn",
                      "--config.oracles.b.kind=fn",
                      "--config.oracles.b.fn=test_propel_math:other_oracle_fn",
                      "--config.lo=0.3", "--config.hi=0.4"])[0]
    out = ev.run(c, str(tmp_path))
    # each task has its own context: the draws GRPO's TaskSource makes for the same seed
    grpo = rollout.TaskSource("gen:math_task", seed=c.seed).next(4)
    assert seen["n"] == 1 and [m[0]["content"] for m in seen["msgs"]] == [t["prompt"] for t in grpo]
    assert out["domain"] == "math" and out["gate_rate"] == pytest.approx(3 / 4)
    assert (out["oracles"]["agreed"], out["oracles"]["disagreement"]) == (2, 1)
    assert out["validity_rate"] == pytest.approx(2 / 4)          # W and the oracles agree
    assert out["solve_counts"] == [1, 0, 0, 1]                   # 1 of 3 trials; 4 + 4 is 8, not 9
    assert out["utility_rate"] == pytest.approx(2 / 4)
    assert out["solver"]["trials"] == 2 * 3 and out["oracles"]["a"]["trials"] == 3 * 2
    assert out["top_topic_rate"] == 1.0 and 0 <= out["self_bleu3"] <= 1
    assert json.load(open(tmp_path / "eval_generator.json"))["solver"]["trials"] == 6


def test_eval_generator_math_bad_config_sentences():
    from rossjax.cli import parse_config

    base = ["--config=configs/eval_generator.py:runlocal", "--config.domain=math"]
    for over, says in [([], "config.oracles.a.path"),
                       (["--config.oracles.a.kind=fn"], "config.oracles.a.fn is empty"),
                       (["--config.oracles.a.kind=oracle", "--config.oracles.b.kind=endpoint"],
                        "config.oracles.b.endpoint.model is empty"),
                       (["--config.oracles.a.kind=oracle", "--config.oracles.b.kind=oracle",
                         "--config.oracles.attempts=0"], "config.oracles.attempts is 0"),
                       (["--config.domain=physics"], "config.domain 'physics'")]:
        c = parse_config(base + over)[0]
        with pytest.raises(ConfigError, match=says):
            ev.check_config(c)
