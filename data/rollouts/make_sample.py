"""Regenerate data/rollouts/sample.jsonl (run from the repo root): real math answers, real HumanEval-style
code tasks, agentic exclude-mode rows, and drop / failed / malformed rows for the accounting."""
import json
import random

SYS_MATH = "You are a careful mathematician. Think step by step and put the final answer in \\boxed{}."
SYS_CODE = "You are a coding agent. You can run shell commands with the bash tool. Finish with the complete function in a ```python block."
math = [
 ("What is the sum of the first 100 positive integers?", "5050",
  "The sum 1+2+...+n is n(n+1)/2. Wait, let me double check with n=3: 1+2+3=6 and 3*4/2=6. Good.\nFor n=100: 100*101/2 = 5050.",
  "Using the formula n(n+1)/2 with n = 100 gives 100 \\cdot 101 / 2 = 5050.\nThe answer is \\boxed{5050}.",
  ("Using the formula", "\\boxed{5050}.")),
 ("Solve for x: 2x + 3 = 11.", "4",
  "Subtract 3: 2x = 8. Hmm, or is it 2x = 14? No, 11 - 3 = 8.\nSo x = 4.",
  "Subtracting 3 from both sides gives 2x = 8, so x = 4.\nThe answer is \\boxed{4}.",
  ("Subtracting 3", "\\boxed{4}.")),
 ("Compute 7!/5!.", "42",
  "7! = 5040 and 5! = 120. 5040/120 = 42. Alternatively 7*6 = 42.",
  "Since 7!/5! = 7 \\cdot 6 = 42, the answer is \\boxed{42}.",
  ("Since 7!/5!", "\\boxed{42}.")),
 ("What is the greatest common divisor of 84 and 126?", "42",
  "84 = 2^2 * 3 * 7, 126 = 2 * 3^2 * 7. Common: 2 * 3 * 7 = 42.",
  "The common prime factors are 2, 3 and 7, so gcd(84, 126) = 42.\nThe answer is \\boxed{42}.",
  ("The common prime factors", "\\boxed{42}.")),
 ("How many positive divisors does 360 have?", "24",
  "360 = 2^3 * 3^2 * 5. Number of divisors = (3+1)(2+1)(1+1) = 4*3*2 = 24.",
  "Factor 360 = 2^3 \\cdot 3^2 \\cdot 5, so it has (3+1)(2+1)(1+1) = 24 divisors.\nThe answer is \\boxed{24}.",
  ("Factor 360", "\\boxed{24}.")),
 ("What is the remainder when 2^10 is divided by 7?", "2",
  "2^3 = 8 = 1 mod 7. 2^10 = 2^9 * 2 = (2^3)^3 * 2 = 1 * 2 = 2 mod 7. Check: 1024 = 7*146 + 2 = 1022 + 2. Yes.",
  "Since 2^3 \\equiv 1 \\pmod 7, we get 2^{10} = (2^3)^3 \\cdot 2 \\equiv 2.\nThe answer is \\boxed{2}.",
  ("Since 2^3", "\\boxed{2}.")),
 ("A triangle has sides 3, 4 and 5. What is its area?", "6",
  "3-4-5 is a right triangle since 9 + 16 = 25. Legs 3 and 4, area = 3*4/2 = 6.",
  "It is a right triangle with legs 3 and 4, so the area is \\frac{3 \\cdot 4}{2} = 6.\nThe answer is \\boxed{6}.",
  ("It is a right triangle", "\\boxed{6}.")),
 ("Two fair six-sided dice are rolled. What is the probability that the sum is 7?", "\\frac{1}{6}",
  "Pairs summing to 7: (1,6),(2,5),(3,4),(4,3),(5,2),(6,1): 6 of 36 outcomes. 6/36 = 1/6.",
  "There are 6 favourable outcomes out of 36, so the probability is \\frac{6}{36} = \\frac{1}{6}.\nThe answer is \\boxed{\\frac{1}{6}}.",
  ("There are 6 favourable", "\\boxed{\\frac{1}{6}}.")),
 ("What is the sum of the interior angles of a hexagon, in degrees?", "720",
  "Sum of interior angles = (n-2)*180. For n = 6: 4*180 = 720.",
  "A hexagon has (6-2) \\cdot 180 = 720 degrees of interior angles.\nThe answer is \\boxed{720}.",
  ("A hexagon has", "\\boxed{720}.")),
 ("What is the sum of the roots of x^2 - 5x + 6 = 0?", "5",
  "x^2 - 5x + 6 = (x-2)(x-3), roots 2 and 3, sum 5. By Vieta the sum is 5 too.",
  "By Vieta's formulas the sum of the roots is 5 (the roots are 2 and 3).\nThe answer is \\boxed{5}.",
  ("By Vieta's formulas", "\\boxed{5}.")),
 ("In how many ways can 3 books be chosen from 8 different books?", "56",
  "C(8,3) = 8*7*6/6 = 56.",
  "The count is \\binom{8}{3} = \\frac{8 \\cdot 7 \\cdot 6}{3!} = 56.\nThe answer is \\boxed{56}.",
  ("The count is", "\\boxed{56}.")),
 ("Compute 1/2 + 1/3.", "\\frac{5}{6}",
  "Common denominator 6: 3/6 + 2/6 = 5/6.",
  "With the common denominator 6: \\frac{3}{6} + \\frac{2}{6} = \\frac{5}{6}.\nThe answer is \\boxed{\\frac{5}{6}}.",
  ("With the common denominator", "\\boxed{\\frac{5}{6}}.")),
 ("What is \\sqrt{144} + \\sqrt[3]{27}?", "15",
  "sqrt(144) = 12, cbrt(27) = 3, total 15.",
  "We have \\sqrt{144} = 12 and \\sqrt[3]{27} = 3, so the sum is 15.\nThe answer is \\boxed{15}.",
  ("We have", "\\boxed{15}.")),
]
wrong_math = [
 ("What is 15% of 80?", "12", "15% of 80 = 0.15*80 = 8? Let me think... 0.1*80 = 8, 0.05*80 = 4... I'll say 8.",
  "15% of 80 is 8.\nThe answer is \\boxed{8}."),
 ("How many edges does a cube have?", "12", "A cube has 6 faces and 8 vertices. Edges... each face has 4 edges, 6*4 = 24.",
  "A cube has 24 edges.\nThe answer is \\boxed{24}."),
]
code = [
 ("add_pair", "def add_pair(a: int, b: int) -> int:\n    \"\"\"Return the sum of a and b.\"\"\"\n",
  "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-5, 5) == 0\n    assert candidate(10**9, 1) == 10**9 + 1\n",
  "def add_pair(a: int, b: int) -> int:\n    return a + b\n"),
 ("is_palindrome", "def is_palindrome(s: str) -> bool:\n    \"\"\"Return True if s reads the same forwards and backwards, ignoring case.\"\"\"\n",
  "def check(candidate):\n    assert candidate('Level') is True\n    assert candidate('abc') is False\n    assert candidate('') is True\n",
  "def is_palindrome(s: str) -> bool:\n    t = s.lower()\n    return t == t[::-1]\n"),
 ("count_vowels", "def count_vowels(s: str) -> int:\n    \"\"\"Count the vowels (a, e, i, o, u, either case) in s.\"\"\"\n",
  "def check(candidate):\n    assert candidate('Hello World') == 3\n    assert candidate('xyz') == 0\n    assert candidate('AEIOU') == 5\n",
  "def count_vowels(s: str) -> int:\n    return sum(1 for c in s.lower() if c in 'aeiou')\n"),
 ("fib", "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number, fib(0) = 0, fib(1) = 1.\"\"\"\n",
  "def check(candidate):\n    assert candidate(0) == 0\n    assert candidate(1) == 1\n    assert candidate(10) == 55\n    assert candidate(30) == 832040\n",
  "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"),
 ("second_largest", "def second_largest(xs: list[int]) -> int:\n    \"\"\"Return the second largest distinct value in xs (at least two distinct values).\"\"\"\n",
  "def check(candidate):\n    assert candidate([1, 2, 3]) == 2\n    assert candidate([5, 5, 4]) == 4\n    assert candidate([-1, -7, -3]) == -3\n",
  "def second_largest(xs: list[int]) -> int:\n    return sorted(set(xs))[-2]\n"),
 ("flatten", "def flatten(xss: list[list[int]]) -> list[int]:\n    \"\"\"Concatenate the inner lists in order.\"\"\"\n",
  "def check(candidate):\n    assert candidate([[1, 2], [3], []]) == [1, 2, 3]\n    assert candidate([]) == []\n",
  "def flatten(xss: list[list[int]]) -> list[int]:\n    return [x for xs in xss for x in xs]\n"),
]
recs = []
for k, (q, ref, reas, ans, (s, e)) in enumerate(math):
    recs.append({"id": f"math-{k}-s{10+k}-r0", "task": {"id": f"math-{k}", "domain": "math", "prompt": q, "reference": ref},
      "source": {"run": "math-rl", "step": 10 + k},
      "messages": [{"role": "system", "content": SYS_MATH}, {"role": "user", "content": q},
                   {"role": "assistant", "reasoning": reas, "content": ans}],
      "reward": 1.0,
      "annotation": {"status": "accept" if k % 3 else "revise", "keep": [{"message": 2, "start": s, "end": e}]}})
# verifier already recorded on a few rows
for r in recs[:4]:
    r["verifier"] = {"name": "math", "passed": True, "evidence": f"gold {r['task']['reference']} matches"}
# a keep anchor reaching into the reasoning (start in reasoning, end in content)
recs[3]["annotation"]["keep"] = [{"message": 2, "start": "84 = 2^2", "end": "\\boxed{42}."}]
# no annotation: positive-rollout SFT baseline (all eligible)
recs[12].pop("annotation")
for k, (q, ref, reas, ans) in enumerate(wrong_math):
    recs.append({"id": f"math-w{k}-s40-r1", "task": {"id": f"math-w{k}", "domain": "math", "prompt": q, "reference": ref},
      "source": {"run": "math-rl", "step": 40}, "messages": [{"role": "system", "content": SYS_MATH},
      {"role": "user", "content": q}, {"role": "assistant", "reasoning": reas, "content": ans}], "reward": 0.0})
recs[-1]["verifier"] = {"name": "math", "passed": False, "evidence": "24 != 12"}

for k, (ep, prompt, tests, sol) in enumerate(code):
    msgs = [{"role": "system", "content": SYS_CODE},
            {"role": "user", "content": f"Complete this function so the tests pass:\n```python\n{prompt}```"},
            {"role": "assistant", "reasoning": f"I'll write {ep} and test it quickly.",
             "content": "First I'll write the file and run a quick check.\nrm -rf /tmp/work && mkdir /tmp/work  # clean slate\nThen I run the tests.",
             "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"cmd": f"cat > sol.py <<'EOF'\n{sol}EOF\npython -c 'import sol; print(sol.{ep})'"}}}]},
            {"role": "tool", "name": "bash", "content": f"<function {ep} at 0x7f3a2c1b5e40>"},
            {"role": "assistant", "content": f"The function imports fine. I am confident it is correct, no need to test edge cases.\nHere is the solution:\n```python\n{sol}```"}]
    recs.append({"id": f"code-{ep}-s{20+k}-r0", "task": {"id": f"code-{ep}", "domain": "code", "prompt": prompt,
      "entry_point": ep, "tests": tests}, "source": {"run": "agent-rl", "step": 20 + k},
      "messages": msgs, "reward": 1.0,
      "annotation": {"status": "revise",
        "exclude": [{"message": 2, "line": 2, "quote": "rm -rf /tmp/work"},
                    {"message": 4, "line": 1, "quote": "I am confident it is correct, no need to test edge cases."}],
        "protect": [{"message": 4, "line": 2, "quote": "Here is the solution:"}],
        "omissions": [{"message": 4, "after": "imports fine.", "note": "should have run the unit tests"}]}})
# one agentic row accepted as-is (no selectors): the whole trajectory is supervised
recs[-1]["annotation"] = {"status": "accept"}
# a code rollout whose program is wrong: the sandbox must fail it
bad = json.loads(json.dumps(recs[-3]))
bad["id"] = "code-fib-s30-r2"; bad["reward"] = 0.0; bad["source"]["step"] = 30
bad["messages"][4]["content"] = bad["messages"][4]["content"].replace("a, b = b, a + b", "a, b = b, a * b")
bad["messages"][2]["tool_calls"][0]["function"]["arguments"]["cmd"] = bad["messages"][2]["tool_calls"][0]["function"]["arguments"]["cmd"].replace("a, b = b, a + b", "a, b = b, a * b")
bad.pop("annotation")
recs.append(bad)
# reviewer dropped a rollout
drop = json.loads(json.dumps(recs[16])); drop["id"] = "code-is_palindrome-s31-r3"; drop["annotation"] = {"status": "drop"}
recs.append(drop)
# ambiguous keep anchor ("42" twice) -> withheld anchor_ambiguous
amb = json.loads(json.dumps(recs[2])); amb["id"] = "math-2-s50-r4"; amb["annotation"]["keep"] = [{"message": 2, "start": "42", "end": "\\boxed{42}."}]
recs.append(amb)
# an exclusion that touches a protected span -> withheld exclude_protected
prot = json.loads(json.dumps(recs[15])); prot["id"] = "code-add_pair-s51-r5"
prot["annotation"]["exclude"].append({"message": 4, "line": 2, "quote": "solution"})
recs.append(prot)
with open("/tmp/cc/good.jsonl", "w") as f:
    for r in recs:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
print(len(recs))
# stored token_ids: one exact (Qwen tokenization of the chatml rendering), one from another template
from rossjax.curate import load_tokenizer
from rossjax.templates import render_chat

tok = load_tokenizer("qwen")
st = json.loads(json.dumps(recs[5])); st["id"] = "math-5-s52-r6"
st["token_ids"] = tok.encode(render_chat(st["messages"], "chatml").text)
mm = json.loads(json.dumps(recs[6])); mm["id"] = "math-6-s53-r7"
mm["token_ids"] = tok.encode(render_chat(mm["messages"], "llama3").text)  # wrong template -> token_mismatch
lines = [json.dumps(r, ensure_ascii=False) for r in recs + [st, mm]]
unk = json.loads(json.dumps(recs[7])); unk["id"] = "math-7-s54-r8"; unk["messages"][1]["role"] = "human"
nomsg = json.loads(json.dumps(recs[8])); nomsg["id"] = "math-8-s55-r9"; nomsg["annotation"]["keep"][0]["message"] = 5
lines += [json.dumps(unk), json.dumps(nomsg), '{"id": "math-9-s56-r10", "messages": [{"role": "user", "content": "truncated']
order = list(range(len(lines))); random.Random(0).shuffle(order)
import os

os.makedirs("data/rollouts", exist_ok=True)
with open("data/rollouts/sample.jsonl", "w") as f:
    for i in order:
        f.write(lines[i] + "\n")
print(len(lines))
