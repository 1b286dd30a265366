"""extract_boxed: the last \\boxed{} / \\fbox{} whose braces close, in time linear in the text."""

import random
import re
import time

from rossjax.verify.answers import extract_boxed


def _scan_each_box(text):
    """The definition, scanning forward from every box (quadratic on unclosed boxes)."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end():i - 1]
    return best


def test_nested_multiple_and_unclosed_boxes():
    assert extract_boxed(r"\boxed{\frac{1}{2}} then \fbox {3}") == "3"
    assert extract_boxed(r"\boxed{a \boxed{b} c}") == "b"        # the last to open, as before
    assert extract_boxed(r"\boxed{1} and \boxed{2") == "1"                # the unclosed one is no answer
    assert extract_boxed(r"} \boxed{x}} {") == "x" and extract_boxed(r"\boxed{}") == ""
    assert extract_boxed(r"\boxed{a\boxed{b}") == "b" and extract_boxed(r"\boxed x") is None


def test_same_answer_as_the_definition_on_random_texts():
    rng = random.Random(0)
    parts = ["\\boxed{", "\\fbox{", "\\boxed {", "{", "}", "x", "\\", " ", "\\boxed"]
    for _ in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 14)))
        assert extract_boxed(text) == _scan_each_box(text), text


def test_a_long_run_of_unclosed_boxes_is_linear():
    text = "\\boxed{" * 15_000 + "5"                    # ~100k characters; quadratic takes minutes
    t = time.perf_counter()
    assert extract_boxed(text) is None
    assert extract_boxed(text + "}") == "5"
    assert time.perf_counter() - t < 1.0
