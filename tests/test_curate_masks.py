"""Mask compiler against a slow obvious reference and every withheld reason, on real tokenizers."""

import copy
import random

import numpy as np
import pytest

from rossjax.curate.masks import compile_rollout
from rossjax.templates import render_chat
from rossjax.tokenizers import load_tokenizer

QWEN = load_tokenizer("qwen")

MATH = {
    "id": "m1", "task": {"id": "t1", "domain": "math", "reference": "12"},
    "source": {"run": "math-rl", "step": 4}, "reward": 1.0,
    "verifier": {"name": "math", "passed": True, "evidence": "12 == 12"},
    "messages": [
        {"role": "user", "content": "What is 3*4? Put the answer in \\boxed{}."},
        {"role": "assistant", "reasoning": "Hmm, 3*4. Wait, 3+4=7? No.\nActually 3*4 = 12.",
         "content": "Multiplying: 3*4 = 12.\nThe answer is \\boxed{12}."}],
    "annotation": {"status": "accept",
                   "keep": [{"message": 1, "start": "Actually", "end": "\\boxed{12}."}]},
}

AGENT = {
    "id": "a1", "task": {"id": "t2", "domain": "swe"}, "source": {"run": "agent-rl", "step": 9},
    "reward": 1.0,
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "Let me look.\nrm -rf build  # oops\nThen run tests.",
         "tool_calls": [{"name": "bash", "arguments": {"cmd": "pytest -q"}}]},
        {"role": "tool", "name": "bash", "content": "1 failed"},
        {"role": "assistant", "content": "Fixed: édition ✓ done.\nAll tests pass."}],
    "annotation": {"status": "revise",
                   "exclude": [{"message": 2, "line": 2, "quote": "rm -rf build"}],
                   "protect": [{"message": 4, "line": 2, "quote": "All tests pass."}],
                   "omissions": [{"message": 2, "after": "Let me look.", "note": "missing cd"}]},
}


def reference(record, tok, template="chatml"):
    """Per-character masks by plain loops, then per token: any character marked."""
    r = render_chat(record["messages"], template, tok)
    text, ann = r.text, record.get("annotation") or {}
    elig = [False] * len(text)
    for p in r.parts:
        for c in range(p.start, p.end):
            elig[c] = elig[c] or p.eligible
    keep = [not ann.get("keep")] * len(text)
    for k in ann.get("keep") or []:
        body = "".join(text[p.text_start:p.text_end] for p in r.message_parts(k["message"]))
        assert body.count(k["start"]) == 1 and body.count(k["end"]) == 1
        s = text.index(k["start"], r.message_parts(k["message"])[0].start)
        e = text.index(k["end"], s) + len(k["end"])
        for c in range(s, e):
            keep[c] = True
        last = [p for p in r.message_parts(k["message"]) if p.kind != "end"][-1]
        if e >= last.text_end:
            end = r.part(k["message"], "end")
            for c in range(end.start, end.end):
                keep[c] = True
    excl = [False] * len(text)
    for x in ann.get("exclude") or []:
        p = r.part(x["message"], x.get("part", "content"))
        lines = text[p.text_start:p.text_end].split("\n")
        base = p.text_start + sum(len(l) + 1 for l in lines[: x["line"] - 1])
        col = -1
        for _ in range(x.get("occurrence", 0) + 1):
            col = lines[x["line"] - 1].index(x["quote"], col + 1 if col < 0 else col + len(x["quote"]))
        for c in range(base + col, base + col + len(x["quote"])):
            excl[c] = True
    ids, offs = tok.encode_with_offsets(text)
    e_tok = [any(elig[c] for c in range(s, e)) for s, e in offs]
    l_tok = [et and any(keep[c] for c in range(s, e)) and not any(excl[c] for c in range(s, e))
             for et, (s, e) in zip(e_tok, offs)]
    return ids, np.array(e_tok, np.uint8), np.array(l_tok, np.uint8)


@pytest.mark.parametrize("tokname", ["qwen", "tekken", "mistral-v3"])
@pytest.mark.parametrize("record", [MATH, AGENT], ids=["keep", "exclude"])
def test_matches_slow_reference(record, tokname):
    tok = load_tokenizer(tokname)
    template = "chatml" if tokname == "qwen" else "mistral"
    ex = compile_rollout(record, tok, template=template)
    assert ex.status == "kept", (ex.reason, ex.detail)
    ids, elig, loss = reference(record, tok, template)
    assert ex.input_ids.tolist() == ids
    np.testing.assert_array_equal(ex.eligible_mask, elig)
    np.testing.assert_array_equal(ex.loss_mask, loss)
    assert ex.input_ids.dtype == np.int32 and ex.loss_mask.dtype == np.uint8
    assert 0 < ex.n_supervised < ex.n_eligible < len(ids)  # never all-zero, never all-one
    assert ex.n_excluded_eligible == ex.n_eligible - ex.n_supervised


def test_random_selectors_match_reference():
    rng = random.Random(0)
    words = "alpha beta gamma delta x = 1 + 2 é 日本 ✓ ok".split()
    for trial in range(30):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) for _ in range(5)]
        rec = copy.deepcopy(AGENT)
        rec["messages"][2]["content"] = "\n".join(lines)
        ln = rng.randint(1, 5)
        toks = lines[ln - 1].split(" ")
        q = " ".join(toks[rng.randint(0, len(toks) - 1):][:2])
        occ = rng.randint(0, lines[ln - 1].count(q) - 1)
        if lines[ln - 1].count(q) != len(lines[ln - 1].split(q)) - 1:
            continue
        rec["annotation"]["exclude"] = [{"message": 2, "line": ln, "quote": q, "occurrence": occ}]
        ex = compile_rollout(rec, QWEN)
        _, elig, loss = reference(rec, QWEN)
        np.testing.assert_array_equal(ex.loss_mask, loss)
        np.testing.assert_array_equal(ex.eligible_mask, elig)


def test_eligible_is_exactly_assistant_parts_and_im_end():
    ex = compile_rollout(AGENT, QWEN, mask_mode="eligible")
    toks = [QWEN.decode([i]) for i in ex.input_ids]
    elig = "".join(t for t, e in zip(toks, ex.eligible_mask) if e)
    assert elig == ("Let me look.\nrm -rf build  # oops\nThen run tests.\n<tool_call>\n"
                    '{"name": "bash", "arguments": {"cmd": "pytest -q"}}\n</tool_call><|im_end|>'
                    "Fixed: édition ✓ done.\nAll tests pass.<|im_end|>")
    ends = [k for k, t in enumerate(toks) if t == "<|im_end|>"]
    assert all(toks[k + 1] == "\n" and not ex.eligible_mask[k + 1] for k in ends[:-1])
    assert sum(t == "<|im_start|>" for t in toks) == 5  # specials are single tokens, context
    assert not any(e for t, e in zip(toks, ex.eligible_mask) if t == "<|im_start|>")
    assert ex.turn_spans == [(toks.index("Let"), ends[2] + 1), (ends[-1] - 11, ends[-1] + 1)]
    np.testing.assert_array_equal(ex.loss_mask, ex.eligible_mask)
    assert ex.n_excluded_eligible == 0


def test_mask_mode_keeps_same_rows():
    ann = compile_rollout(MATH, QWEN)
    full = compile_rollout(MATH, QWEN, mask_mode="eligible")
    assert ann.status == full.status == "kept" and ann.n_supervised < full.n_supervised
    bad = copy.deepcopy(MATH)
    bad["annotation"]["keep"][0]["start"] = "not there"
    assert compile_rollout(bad, QWEN, mask_mode="eligible").reason == "anchor_missing"


def test_no_annotation_supervises_all_eligible():
    rec = copy.deepcopy(MATH)
    rec.pop("annotation")
    ex = compile_rollout(rec, QWEN)
    assert ex.status == "kept"
    np.testing.assert_array_equal(ex.loss_mask, ex.eligible_mask)
    assert ex.provenance == {"task_id": "t1", "domain": "math", "run": "math-rl", "step": 4,
                             "reward": 1.0}


def variant(base, path, value):
    rec = copy.deepcopy(base)
    obj = rec
    for k in path[:-1]:
        obj = obj[k]
    if value is KeyError:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return rec


WITHHELD = [
    (variant(MATH, ["annotation", "status"], "drop"), "annotation_drop"),
    (variant(MATH, ["verifier", "passed"], False), "verifier_failed"),
    (variant(MATH, ["annotation", "keep", 0, "start"], "Nope"), "anchor_missing"),
    (variant(MATH, ["annotation", "keep", 0, "start"], "3*4"), "anchor_ambiguous"),
    (variant(MATH, ["annotation", "keep", 0], {"message": 1, "start": "The answer",
                                                "end": "Actually"}), "anchor_order"),
    (variant(MATH, ["annotation", "keep"], [{"message": 1, "start": "Actually", "end": "= 12.\nThe"},
                                            {"message": 1, "start": "Multiplying", "end": "answer"}]),
     "anchor_order"),
    (variant(MATH, ["annotation", "keep"], [{"message": 1, "start": "The answer", "end": "\\boxed{12}."},
                                            {"message": 1, "start": "Multiplying", "end": "12.\n"}]),
     "anchor_order"),
    (variant(MATH, ["annotation", "keep", 0, "message"], 0), "anchor_not_eligible"),
    (variant(AGENT, ["annotation", "exclude", 0, "line"], 7), "selector_unresolved"),
    (variant(AGENT, ["annotation", "exclude", 0, "occurrence"], 1), "selector_unresolved"),
    (variant(AGENT, ["annotation", "exclude", 0, "quote"], "rm -rf  build"), "selector_unresolved"),
    (variant(AGENT, ["annotation", "exclude", 0], {"message": 3, "line": 1, "quote": "1"}),
     "selector_not_eligible"),
    (variant(AGENT, ["annotation", "exclude", 0], {"message": 4, "line": 2, "quote": "tests"}),
     "exclude_protected"),
    (variant(AGENT, ["annotation", "exclude"], [{"message": 2, "line": k} for k in (1, 2, 3)]
             + [{"message": 2, "line": 1, "part": "tool_calls"}, {"message": 4, "line": 1},
                {"message": 4, "line": 2, "quote": "All"}]), "exclude_protected"),
    (variant(AGENT, ["annotation", "exclude", 0], {"message": 0, "line": 1}),
     "selector_not_eligible"),
    (variant(MATH, ["token_ids"], [1, 2, 3]), "token_mismatch"),
]


def test_verdict_reason_comes_before_the_review():
    # the same reason under every recipe: positive_sft ignores a drop but never a failed verdict
    rec = variant(variant(MATH, ["annotation", "status"], "drop"), ["verifier", "passed"], False)
    for mode in ("annotated", "eligible"):
        ex = compile_rollout(rec, QWEN, mask_mode=mode)
        assert (ex.status, ex.reason) == ("withheld", "verifier_failed") and "12 == 12" in ex.detail


@pytest.mark.parametrize("record,code", WITHHELD)
def test_withheld_reasons(record, code):
    ex = compile_rollout(record, QWEN)
    assert (ex.status, ex.reason) == ("withheld", code), ex.detail
    assert ex.detail and ex.provenance["task_id"]


def test_zero_supervised_is_withheld_never_silent():
    rec = variant(AGENT, ["annotation", "protect"], [])
    rec["annotation"]["exclude"] = [
        {"message": 2, "line": k} for k in (1, 2, 3)] + [
        {"message": 2, "line": k, "part": "tool_calls"} for k in (1, 2, 3)] + [
        {"message": 4, "line": 1}, {"message": 4, "line": 2}]
    ex = compile_rollout(rec, QWEN)
    # The newline tokens and <|im_end|> markers stay supervised: exclusions cover quoted text.
    assert ex.status == "kept" and ex.n_supervised < 12
    only_user = {"id": "u", "messages": [{"role": "user", "content": "hi"}]}
    ex = compile_rollout(only_user, QWEN)
    assert (ex.status, ex.reason) == ("withheld", "no_supervised_tokens")


def test_invalid_and_too_long():
    ex = compile_rollout({"id": "x", "messages": [{"role": "robot", "content": "x"}]}, QWEN)
    assert (ex.status, ex.reason) == ("invalid", "invalid_record") and "robot" in ex.detail
    ex = compile_rollout(MATH, QWEN, max_length=10)
    assert (ex.status, ex.reason) == ("withheld", "too_long")
    assert len(ex.input_ids) > 10  # the packer, not the compiler, truncates


def test_stored_token_ids_projection():
    text = render_chat(AGENT["messages"], "chatml").text
    # A different but valid tokenization of the same text (as a sampler might have produced):
    # split every token that has more than one byte at its first byte... use tekken-style pieces.
    ids = QWEN.encode(text)
    alt = []
    for i in ids:
        b = QWEN.token_bytes(i)
        if len(b) > 1 and i < 151643 and b[:1] != b" ":
            alt += QWEN.encode(b[:1].decode("latin-1")) if b[0] < 0x80 else [i]
            alt += QWEN.encode(b[1:].decode("utf-8", "strict")) if b[0] < 0x80 else []
        else:
            alt.append(i)
    assert alt != ids and QWEN.decode(alt) == text
    rec = dict(AGENT, token_ids=alt)
    ex = compile_rollout(rec, QWEN)
    assert ex.status == "kept" and ex.input_ids.tolist() == alt  # never re-tokenized
    # Same characters supervised as the rendered-token compile.
    base = compile_rollout(AGENT, QWEN)
    sup = lambda e: "".join(QWEN.decode([i]) for i, m in zip(e.input_ids, e.loss_mask) if m)  # noqa
    assert sup(ex) == sup(base)
    # Stored ids without the trailing newline after the last <|im_end|> are accepted too.
    assert compile_rollout(dict(AGENT, token_ids=ids[:-1]), QWEN).status == "kept"
    assert compile_rollout(dict(AGENT, token_ids=ids[:-3] + ids[-2:]), QWEN).reason == "token_mismatch"
    assert compile_rollout(dict(AGENT, token_ids=[10 ** 7]), QWEN).reason == "token_mismatch"


def test_stored_tokens_split_multibyte_character():
    tok = load_tokenizer("tekken")
    rec = copy.deepcopy(AGENT)
    rec["messages"][4]["content"] = "Done 😀\nAll tests pass."
    rec["annotation"] = {"status": "accept", "exclude": [{"message": 4, "line": 1, "quote": "😀"}]}
    text = render_chat(rec["messages"], "mistral").text
    rec["token_ids"] = tok.encode(text)
    ex = compile_rollout(rec, tok, template="mistral")
    assert ex.status == "kept"
    emoji = [k for k, i in enumerate(ex.input_ids) if any(b >= 0xF0 or 0x80 <= b < 0xC0
                                                          for b in tok.token_bytes(int(i)))]
    assert len(emoji) >= 2  # the emoji is split over several tokens ...
    assert all(ex.eligible_mask[k] and not ex.loss_mask[k] for k in emoji)  # ... all excluded


def test_tokenizer_template_masks_or_refuses():
    from test_curate_chat import JINJA_CHATML

    tok = load_tokenizer("qwen", chat_template=JINJA_CHATML)
    a, b = compile_rollout(AGENT, tok, template="tokenizer"), compile_rollout(AGENT, QWEN)
    assert a.status == "kept" and a.input_ids.tolist() == b.input_ids.tolist()
    np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
    np.testing.assert_array_equal(a.eligible_mask, b.eligible_mask)
    rewrites = load_tokenizer("qwen", chat_template=JINJA_CHATML.replace(
        "{%- if m.reasoning_content is defined %}",
        "{%- if m.reasoning_content is defined and loop.last %}"))
    ex = compile_rollout(MATH_TWO_TURNS, rewrites, template="tokenizer")
    assert (ex.status, ex.reason) == ("withheld", "template_rewrites_history")
    assert compile_rollout(AGENT, QWEN, template="tokenizer").reason == "template_unavailable"


MATH_TWO_TURNS = dict(MATH, messages=MATH["messages"] + [
    {"role": "user", "content": "And 3*5?"},
    {"role": "assistant", "reasoning": "3*5 = 15.", "content": "\\boxed{15}"}])


def _big_row(n_lines: int):
    """About 55 bytes a line: 18000 lines is a 1 MB assistant turn."""
    lines = [f"line {i} says x{i}; and then some filler text here ok" for i in range(n_lines)]
    return lines, [{"role": "user", "content": "go"},
                   {"role": "assistant", "content": "\n".join(lines)}]


def test_a_1mb_row_with_thousands_of_selectors_compiles_in_seconds():
    """Issue 22: resolution was quadratic (each selector split the whole turn, each exclusion was
    compared with every protected span): a 1 MB row ran past 3 minutes. Now it is linear."""
    import time

    from rossjax.curate.selectors import exclude_intervals, keep_intervals

    lines, msgs = _big_row(18000)
    assert len(msgs[1]["content"]) > 1_000_000
    ann = {"status": "revise",
           "exclude": [{"message": 1, "line": i + 1, "quote": f"x{i};"} for i in range(0, 18000, 2)],
           "protect": [{"message": 1, "line": i + 1} for i in range(1, 18000, 2)]}
    keep = [{"message": 1, "start": f"line {i} says", "end": f"x{i};"} for i in range(0, 18000, 3)]
    for a in (ann, {"status": "accept", "keep": keep}):
        t0 = time.perf_counter()
        ex = compile_rollout({"id": "big", "messages": msgs, "annotation": a}, QWEN)
        assert ex.status == "kept" and time.perf_counter() - t0 < 20  # was > 180 s
    # the intervals, against offsets computed from the lines directly
    r = render_chat(msgs, "chatml", QWEN)
    base = r.part(1, "content").text_start
    starts = np.cumsum([0] + [len(x) + 1 for x in lines])[:-1] + base
    excl = exclude_intervals(r, ann)
    assert excl == [(int(starts[i]) + lines[i].index(f"x{i};"),
                     int(starts[i]) + lines[i].index(f"x{i};") + len(f"x{i};"))
                    for i in range(0, 18000, 2)]
    kept = keep_intervals(r, keep)
    assert kept[:3] == [(int(starts[i]), int(starts[i]) + lines[i].index(";") + 1)
                        for i in (0, 3, 6)]


def test_suffix_array_anchors_agree_with_the_scan(monkeypatch):
    """Long messages with many anchors are counted on a suffix array: same intervals, same
    reasons as one scan per anchor (multi-byte text, anchors across parts, ambiguous, missing)."""
    from rossjax.curate import selectors

    rng = random.Random(3)
    words = "ab a b aba é 日本 ✓ 😀 x\n".split(" ")
    seen = set()
    for trial in range(300):
        msgs = [{"role": "user", "content": "q"}]
        for _ in range(2):
            msgs.append({"role": "assistant", "reasoning": "".join(rng.choices(words, k=6)),
                         "content": "".join(rng.choices(words, k=rng.randint(1, 25)))})
            msgs.append({"role": "user", "content": "ok"})
        c = msgs[1]["content"]

        def sub():
            i = rng.randrange(len(c))
            return c[i:i + rng.randint(1, 3)]
        keep = [{"message": rng.choice([1, 1, 3]), "start": sub(), "end": sub()}
                for _ in range(rng.randint(1, 2))]
        got = []
        for budget in (1 << 25, 0):
            monkeypatch.setattr(selectors, "FIND_BUDGET", budget)
            r = render_chat(msgs, "chatml", QWEN)
            try:
                got.append(selectors.keep_intervals(r, keep))
            except selectors.SelectorError as e:
                got.append((e.code, e.detail))
        assert got[0] == got[1], (keep, got)
        seen.add(got[0][0] if isinstance(got[0], tuple) else "ok")
    assert {"ok", "anchor_missing", "anchor_ambiguous"} <= seen
