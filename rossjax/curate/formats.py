"""Rows as other tools write them, turned into rollout records (docs/data.md, "Input formats").

`normalize(obj, fields)` runs on every row before the schema check. It accepts:
  * rollout records (docs/data.md) as they are;
  * TRL conversational rows: `messages` (an `id` is optional);
  * TRL prompt/completion rows: `prompt` and `completion`, each a string or a message list;
  * verl datasets (`prompt` messages, `ability`, `reward_model.ground_truth`, `data_source`,
    `extra_info.index`) with a `response` (or a one-element `responses`) column;
  * verl rollout dumps (`trainer.rollout_data_dir`): `input`, `output`, `score`, `step` (and
    `gts`, the ground truth, as task.reference): `score` is the row's reward and its verdict
    (passed at >= 1.0, the full score of verl's rule-based rewards; --config.fields.reward_key=
    score with reward_threshold sets another), and an `input` that verl rendered with the
    policy's chat template (ChatML or Llama 3, with its special tokens or decoded without them,
    as verl's dump does) is split back into its turns, so curate's template renders it once;
  * any columns named by a field mapping (config.fields: input_key, label_key, reward_key with
    reward_threshold, id_key), applied on top of the format found above: a mapping names what
    it overrides and keeps the rest (a verl dump's `step`, a TRL row's prompt, ...).
Inside messages: `reasoning_content` is read as `reasoning`, content given as a list of text parts
is joined, and the `developer` role is the system turn. A row without an id gets a stable one
derived from its content ("sha-" + 16 hex of the SHA-256 of its messages, tools, task and
source), and the run says how many ids it derived. A row that cannot be read raises
`FormatError` (one reason).
"""

from __future__ import annotations

import hashlib
import json
import math

# Fields of a rollout record carried over from a mapped or converted row.
RECORD_KEYS = ("id", "task", "source", "messages", "tools", "token_ids", "reward", "verifier",
               "annotation")
FIELD_KEYS = ("input_key", "label_key", "reward_key", "reward_threshold", "id_key")


class FormatError(ValueError):
    """A row that no accepted format can read; the message is the row's `invalid` reason."""


def _tname(x) -> str:
    return "null" if x is None else type(x).__name__


def _content(c, where: str):
    """Content as a string: a list of OpenAI/TRL parts is joined when every part is text."""
    if not isinstance(c, list):
        return c
    texts = []
    for j, p in enumerate(c):
        if isinstance(p, str):
            texts.append(p)
        elif (isinstance(p, dict) and p.get("type", "text") == "text"
              and isinstance(p.get("text"), str)):
            texts.append(p["text"])
        else:
            kind = p.get("type") if isinstance(p, dict) else _tname(p)
            raise FormatError(f"{where}.content[{j}] is a {kind!r} part; only text parts can be "
                              f"rendered for training")
    return "".join(texts)


def _message(m, where: str):
    if not isinstance(m, dict):
        return m  # the schema check names it
    out = dict(m)
    if out.get("role") == "developer":  # OpenAI's newer name for the system turn
        out["role"] = "system"
    if "reasoning_content" in out:  # vLLM, DeepSeek and Qwen3 templates use this name
        rc = out.pop("reasoning_content")
        if out.get("reasoning") is None and rc is not None:
            out["reasoning"] = rc
    if "content" in out:
        out["content"] = _content(out["content"], where)
    return out


def _as_messages(value, role: str, what: str) -> list:
    """A prompt or completion column: a string is one `role` message, a list is messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, dict) and "role" in value:
        return [value]
    if isinstance(value, list):
        return list(value)
    raise FormatError(f"{what} must be a string or a list of messages, got {_tname(value)}")


def _reward_verdict(rec: dict, key: str, value, threshold) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and math.isnan(value)):
        raise FormatError(f"{key} (the reward column) must be a number, got {value!r}")
    rec["reward"] = float(value)
    if threshold is not None and threshold != "":
        passed = float(value) >= float(threshold)
        rec["verifier"] = {"name": "reward_threshold", "passed": passed,
                           "evidence": f"{key}={value} {'>=' if passed else '<'} {threshold}"}


def _mapped(obj: dict, f: dict, found: dict | None) -> dict:
    """The mapping's columns over `found`, the record the format detection made of the row
    (None when it could not read it): input_key replaces the prompt turns, label_key the
    trailing assistant turns; everything else detected is kept."""
    if found is None or found is obj:
        found = {k: obj[k] for k in RECORD_KEYS if k in obj}
    rec = dict(found)
    old = rec.get("messages") if isinstance(rec.get("messages"), list) else []
    cut = len(old)
    while cut and isinstance(old[cut - 1], dict) and old[cut - 1].get("role") == "assistant":
        cut -= 1
    prompt, completion = old[:cut], old[cut:]
    if f.get("input_key"):
        key = f["input_key"]
        if key not in obj:
            raise FormatError(f"{key} (config.fields.input_key) is missing")
        prompt = _as_messages(obj[key], "user", key)
    if f.get("label_key"):
        key = f["label_key"]
        if key not in obj:
            raise FormatError(f"{key} (config.fields.label_key) is missing")
        completion = _as_messages(obj[key], "assistant", key)
    if f.get("input_key") or f.get("label_key"):
        rec["messages"] = prompt + completion
    if f.get("reward_key") and "verifier" not in obj:
        rec.pop("verifier", None)  # the mapping's reward decides, not the one the format found
    if f.get("reward_key"):
        key = f["reward_key"]
        if key not in obj:
            raise FormatError(f"{key} (config.fields.reward_key) is missing")
        _reward_verdict(rec, key, obj[key], f.get("reward_threshold"))
    if f.get("id_key"):
        key = f["id_key"]
        if obj.get(key) is None:
            raise FormatError(f"{key} (config.fields.id_key) is missing")
        rec["id"] = str(obj[key])
    return rec


def _verl_dataset(obj: dict) -> dict:
    rec = {k: obj[k] for k in RECORD_KEYS if k in obj and k != "messages"}
    msgs = _as_messages(obj["prompt"], "user", "prompt")
    resp = obj.get("response", obj.get("responses"))
    if isinstance(resp, list):
        if len(resp) != 1:
            raise FormatError(f"responses holds {len(resp)} responses; write one row per response")
        resp = resp[0]
    if resp is not None:
        msgs += _as_messages(resp, "assistant", "response")
    rec["messages"] = msgs
    task = dict(rec.get("task") or {})
    if isinstance(obj.get("ability"), str):
        task.setdefault("domain", obj["ability"])  # verl's ability names the verifier (math, ...)
    rm = obj.get("reward_model")
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        gt = rm["ground_truth"]
        task.setdefault("reference", gt if isinstance(gt, str) else json.dumps(gt))
    extra = obj.get("extra_info") if isinstance(obj.get("extra_info"), dict) else {}
    if obj.get("data_source") is not None and extra.get("index") is not None:
        task.setdefault("id", f"{obj['data_source']}-{extra['index']}")
    if task:
        rec["task"] = task
    if obj.get("data_source") is not None:
        rec.setdefault("source", {"run": str(obj["data_source"])})
    return rec


# Chat templates a verl dump's `input` may have been rendered with: (turn pattern with its
# special tokens, the same with them decoded away, how a turn is written back, generation prompt).
_RENDERED = (
    (r"<\|im_start\|>(system|user|assistant|tool)\n(.*?)<\|im_end\|>\n", "<|im_start|>{}\n{}<|im_end|>\n",
     "<|im_start|>assistant\n"),
    (r"<\|start_header_id\|>(system|user|assistant|ipython)<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>",
     "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
     "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    (r"(system|user|assistant|tool)\n(.*?)\n(?=(?:system|user|assistant|tool)\n)", "{}\n{}\n",
     "assistant\n"),  # ChatML decoded with skip_special_tokens (verl's default)
)
VERL_DUMP_THRESHOLD = 1.0  # verl's rule-based rewards give 1.0 to a correct answer


def split_rendered(text: str) -> list[dict] | None:
    """The turns of a prompt a chat template already rendered (ending in the assistant's
    generation prompt), or None when `text` is not one. Only an exact split counts: the turns
    written back must give `text` again, character for character."""
    import re

    for pattern, turn, gen in _RENDERED:
        body = text[len("<|begin_of_text|>"):] if text.startswith("<|begin_of_text|>") else text
        if not body.endswith(gen) or len(body) == len(gen):
            continue
        msgs = [{"role": "tool" if r == "ipython" else r, "content": c}
                for r, c in re.findall(pattern, body, re.S)]
        if msgs and "".join(turn.format("ipython" if m["role"] == "tool" and "eot" in turn
                                        else m["role"], m["content"]) for m in msgs) + gen == body:
            return msgs
    return None


def _verl_dump(obj: dict) -> dict:
    rec = {k: obj[k] for k in RECORD_KEYS if k in obj and k != "messages"}
    prompt = split_rendered(obj["input"]) if isinstance(obj["input"], str) else None
    rec["messages"] = (prompt or _as_messages(obj["input"], "user", "input")) + _as_messages(
        obj["output"], "assistant", "output")
    if "score" in obj and "reward" not in rec:
        _reward_verdict(rec, "score", obj["score"], None if "verifier" in rec else
                        VERL_DUMP_THRESHOLD)
    gts = obj.get("gts")
    if isinstance(gts, (str, int, float)) and not isinstance(gts, bool):
        rec["task"] = {"reference": str(gts), **(rec.get("task") or {})}
    if isinstance(obj.get("step"), int):
        rec.setdefault("source", {"step": obj["step"]})
    return rec


def content_id(rec: dict) -> str:
    """A stable id from a row's content: the same messages, tools, task and source give the same
    id (so a repeated row is found as a duplicate; the same answer to another task is not)."""
    blob = json.dumps([rec.get(k) for k in ("messages", "tools", "task", "source")],
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return "sha-" + hashlib.sha256(blob.encode("utf-8", "backslashreplace")).hexdigest()[:16]


def normalize(obj, fields: dict | None = None) -> tuple[object, bool]:
    """(record, whether its id was derived). Raises FormatError for a row no format can read."""
    if not isinstance(obj, dict):
        return obj, False
    f = {k: v for k, v in (fields or {}).items() if v not in (None, "")}
    if f.get("input_key") or f.get("label_key") or f.get("id_key") or f.get("reward_key"):
        try:
            found = _detect(obj)
        except FormatError:  # a layout the mapping's own columns may still read
            found = None
        rec = _mapped(obj, f, found)
    else:
        rec = _detect(obj)
    return _finish(obj, rec)


def _detect(obj: dict):
    """The record of a row in one of the accepted layouts (the row itself when none fits)."""
    if "messages" in obj:
        rec = obj
    elif "prompt" in obj and "completion" in obj:  # TRL prompt/completion
        rec = {k: obj[k] for k in RECORD_KEYS if k in obj}
        rec["messages"] = (_as_messages(obj["prompt"], "user", "prompt")
                           + _as_messages(obj["completion"], "assistant", "completion"))
    elif "prompt" in obj and not isinstance(obj["prompt"], str):  # verl dataset (+ responses)
        rec = _verl_dataset(obj)
    elif "input" in obj and "output" in obj:  # verl rollout dump
        rec = _verl_dump(obj)
    else:
        rec = obj
    return rec


def _finish(obj: dict, rec: dict) -> tuple[object, bool]:
    """Messages in the record schema's names, tools parsed, an id derived where none is given."""
    msgs = rec.get("messages")
    if isinstance(msgs, list):
        new = [_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
        if rec is obj and new != msgs:
            rec = dict(obj)
        rec["messages"] = new
    if isinstance(rec.get("tools"), str):  # verl and HF datasets often store tools as JSON text
        try:
            rec = {**rec, "tools": json.loads(rec["tools"])}
        except json.JSONDecodeError as e:
            raise FormatError(f"tools is a string that is not JSON ({e.msg})") from None
    if rec.get("id") is None and isinstance(msgs, list) and msgs:
        return {**rec, "id": content_id(rec)}, True
    return rec, False
