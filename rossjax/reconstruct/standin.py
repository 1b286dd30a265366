"""A STAND-IN endpoint, not a model: an OpenAI-compatible chat-completions server on 127.0.0.1
whose answers are rules over the request and the shipped corpus, so `:runlocal` shows the whole
reconstruction (kept trajectories, the four signals, thresholds, SFT rows) offline with nothing
started by hand. Its model id says so (`rules-standin`); so do report.json and stderr.

The rules read only what the prompt shows the stage (prompts.py): the agent's stages see x̂,
Ê's ids and titles and the history, never y*; the stand-in looks opened documents up in the
corpus by id (what `open` returned) to quote them in its draft, and the judges check each
claim against the evidence text they are shown. Figures it yields measure these rules, not a
model: they show that every stage, check and output works, nothing about RetroGen's gains.

  cues      none beyond the rules'
  rubric    the paper's rubric categories (coverage, structure, synthesis, citation), one
            criterion each
  task      a request to research the artifact's kind on its most frequent content words
            (no leak-rule cue, no 8-word run)
  plan      search, open, draft
  step      RetroGen: search each Ê title and open that document (3 at most); ForwardGen:
            search the task's words, open the hits; then a draft of each opened document's
            first sentence with its id cited
  sampling  at temperature T > 0 a draft line misquotes its figure with probability T/2 (a
            sampling slip a model makes: the line is then not in the evidence and grounding says
            so), drawn from a hash of the request, so a run is reproducible and the judges and
            thresholds have traces of unequal quality to rank; at T = 0 (:runlocal) never
  judges    rubric / quality by the draft's citations and sentences; grounding: a claim is
            supported when its sentence occurs in the cited evidence; consistency: every
            observation answers its call, every open names an id an earlier search returned,
            every cited id was opened
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_ID = "rules-standin"
NOTICE = (f"stand-in endpoint ({MODEL_ID}): rule-based answers over the corpus, NOT a model "
          f"(rossjax/reconstruct/standin.py)")
STOP = set("the a an and or of to in on for with by from as at is are was were be that this "
           "which its it their than more most over into per not no under after before".split())
HIT = re.compile(r"(\S+) \(\d+\.\d+\): ")
NUMBER = re.compile(r"\b\d{3,}\b")
CITE = re.compile(r"\[([^\]\s]+)\]")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def _claims(draft: str) -> list[str]:
    # a line of the stand-in's draft is one claim with its citation after the full stop
    return [x.strip() for x in draft.splitlines() if x.strip()]


def _section(text: str, start: str, end: str | None = None) -> str:
    body = text.split(start, 1)[1] if start in text else ""
    return body.split(end, 1)[0] if end and end in body else body


def induced_task(artifact: str, kind: str, named=()) -> str:
    """The task rule: a request to research the artifact's most frequent content words (those
    inside a named figure or a [citation] left out: naming it would leak the answer)."""
    words = [w for w in re.findall(r"[a-z][a-z-]{4,}", CITE.sub("", artifact).lower())
             if w not in STOP and not any(w in n for n in named)]
    top = [w for w, _ in Counter(words).most_common(5)]
    return (f"Research the corpus's sources on {', '.join(top)}; write the {kind}, citing each "
            f"claim's document.")


def _slips(user: str, temperature: float, n: int) -> list[bool]:
    """n seeded draws of a sampling slip (probability temperature / 2), from the request."""
    if temperature <= 0:
        return [False] * n
    draw = lambda i: int.from_bytes(hashlib.blake2b(  # noqa: E731
        f"{temperature}:{i}:{user}".encode(), digest_size=8).digest(), "little") / 2.0 ** 64
    return [draw(i) < temperature / 2 for i in range(n)]


def _misquote(line: str) -> str:
    # the figure a slip gets wrong: its first digit moved by one (1186 -> 2186, 942 -> 842)
    m = NUMBER.search(line)
    if not m:
        return line
    d = int(m.group(0)[0])
    return line[:m.start()] + str(d + 1 if d < 9 else d - 1) + line[m.start() + 1:]


class Rules:
    def __init__(self, corpus_path: str):
        with open(corpus_path, encoding="utf-8") as f:
            self.docs = {d["id"]: d for d in map(json.loads, filter(str.strip, f))}

    def answer(self, user: str, temperature: float = 0.0) -> dict:
        stage = re.search(r"^STAGE: (\S+)", user, re.M).group(1)
        if stage == "step":
            return self.step(user, temperature)
        return getattr(self, stage)(user)

    def cues(self, user):
        return {"cues": []}

    def task(self, user):
        art = _section(user, "<<<\n", "\n>>>")
        kind = (re.search(r"^Domain: .*\((.+)\)$", user, re.M) or re.search(
            r"^Domain: (.+)$", user, re.M)).group(1)
        named = set(re.findall(r"'([^']+)'", _section(user, "figures (", ")").lower()))
        return {"task": induced_task(art, kind, named)}

    def rubric(self, user):
        return {"rubric": [
            {"criterion": "Covers the main sources the subject needs", "aspect": "coverage"},
            {"criterion": "Is organized into clear, ordered points", "aspect": "structure"},
            {"criterion": "Relates the sources to one another", "aspect": "synthesis"},
            {"criterion": "Cites the source document of every claim", "aspect": "citation"}]}

    def plan(self, user):
        return {"plan": [{"action": "search", "purpose": "find the documents on the subject"},
                         {"action": "open", "purpose": "read the most relevant hits"},
                         {"action": "draft", "purpose": "write the answer from what was read"}]}

    def step(self, user, temperature: float = 0.0):
        hist = _section(user, "HISTORY:\n", "\n\nTool steps used")
        hist = _section(user, "HISTORY:\n", "\n\nThe tool budget") if not hist else hist
        opened = re.findall(r'call open \{"id": "([^"]+)"\}', hist)
        searched = re.findall(r'call search \{"query": "([^"]+)"\}', hist)
        hits = [h for h in HIT.findall(hist) if h in self.docs]
        evidence = re.findall(r"^- (\S+): ", _section(user, "retrieved for this task:\n",
                                                      "\n\nPLAN:"), re.M)
        budget = "The tool budget is spent" not in user
        if budget and len(opened) < 3:
            todo = [e for e in evidence if e in self.docs and e not in opened]
            if todo:  # RetroGen: find each Ê document by search, then open it
                doc = self.docs[todo[0]]
                title = doc.get("title") or doc["text"][:60]
                if title not in searched:
                    return {"note": "Find the source.", "action": "search",
                            "arguments": {"query": title}}
                return {"note": "Open the source.", "action": "open",
                        "arguments": {"id": todo[0]}}
            if not evidence:  # ForwardGen: search the task's words, open its hits
                if not searched:
                    query = _section(user, "sources on ", "; write") or "sources"
                    return {"note": "Search the subject.",
                            "action": "search", "arguments": {"query": query}}
                new = [h for h in hits if h not in opened]
                if new:
                    return {"note": "Open a hit.", "action": "open",
                            "arguments": {"id": new[0]}}
        lines = [f"{_sentences(self.docs[i]['text'])[0]} [{i}]" for i in opened if i in self.docs]
        lines = [_misquote(x) if slip else x
                 for x, slip in zip(lines, _slips(user, temperature, len(lines)))]
        text = "\n".join(lines) or "The corpus search found no source for this task."
        return {"note": "Answer from what was read.", "action": "draft",
                "arguments": {"text": text}}

    @staticmethod
    def _draft(user: str, head: str) -> str:
        return _section(user, head + "\n<<<\n", "\n>>>")

    def verify_rubric(self, user):
        draft = self._draft(user, "ANSWER TO JUDGE:")
        cites, n = set(CITE.findall(draft)), len(_claims(draft))
        cited = sum(bool(CITE.search(s)) for s in _claims(draft))
        grade = {"coverage": len(cites) >= 3, "structure": n >= 2, "synthesis": len(cites) >= 2,
                 "citation": n > 0 and cited == n}
        out = []
        for k, aspect in enumerate(re.findall(r"^\d+\. \((\w+)\)", user, re.M), 1):
            ok = grade.get(aspect, bool(cites))
            out.append({"criterion": k, "verdict": "full" if ok else
                        ("partial" if cites else "missed"), "why": f"{len(cites)} sources cited"})
        return {"verdicts": out}

    def verify_quality(self, user):
        cites = set(CITE.findall(self._draft(user, "ANSWER TO JUDGE:")))
        return {"score": 1 + min(4, len(cites) + 1) if cites else 1,
                "why": f"{len(cites)} distinct sources cited"}

    def verify_grounding(self, user):
        ev = _section(user, "EVIDENCE (the documents the claims may rest on):\n",
                      "\n\nNOTES OF THE WORK:")
        texts = dict(re.findall(r"^\[(\S+)\] [^\n]*\n(.*?)(?=\n\n\[|\Z)", ev, re.M | re.S))
        claims = []
        for s in _claims(self._draft(user, "FINAL ANSWER:")):
            ids = CITE.findall(s)
            bare = CITE.sub("", s).strip()
            src = next((i for i in ids if bare and bare in texts.get(i, "")), None)
            claims.append({"source": "draft", "claim": bare[:200], "supported": src is not None,
                           "evidence": src})
        return {"claims": claims or [{"source": "draft", "claim": "(none)", "supported": False,
                                      "evidence": None}]}

    def verify_consistency(self, user):
        flow = _section(user, "WORKFLOW (numbered entries):\n", "\n\nList the workflow")
        parts = re.split(r"^\[(\d+)\] (\w+)", flow, flags=re.M)[1:]  # an entry spans lines
        refs, found, opened, last_call = [], {}, {}, None
        for num, kind, rest in zip(parts[::3], parts[1::3], parts[2::3]):
            k = int(num)
            if kind == "call":
                last_call = k
                m = re.search(r'^ open \{"id": "([^"]+)"\}', rest)
                if m:
                    src = found.get(m.group(1))
                    refs.append({"entry": k, "refers_to": src or 1, "consistent": src is not None,
                                 "why": "the id came from a search" if src else "no search gave it"})
                    opened[m.group(1)] = k
            elif kind == "observation" and last_call:
                refs.append({"entry": k, "refers_to": last_call, "consistent": True,
                             "why": "answers its call"})
                for h in re.findall(r"^:? ?(\S+) \(\d+\.\d+\): ", rest, re.M):
                    found.setdefault(h, k)
            elif kind == "draft":
                for i in set(CITE.findall(rest)):
                    refs.append({"entry": k, "refers_to": opened.get(i, 1),
                                 "consistent": i in opened, "why": f"cites {i}"})
        return {"references": [r for r in refs if r["refers_to"] < r["entry"]]}


class StandinServer:
    """`with StandinServer(corpus) as s:` serves on `s.url` (a thread of this process)."""

    def __init__(self, corpus_path: str):
        rules = Rules(corpus_path)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet: the run's report accounts for requests
                pass

            def _send(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                content = json.dumps(rules.answer(req["messages"][1]["content"],
                                                  float(req.get("temperature") or 0.0)))
                self._send({"id": "standin", "object": "chat.completion", "model": MODEL_ID,
                            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                "role": "assistant", "content": content}}],
                            "usage": {"prompt_tokens": 0, "completion_tokens": 0}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for serve_forever's next poll: 10 ms, not its default 0.5 s
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        self.model_id = MODEL_ID

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        print(f"{NOTICE} on {self.url}", file=sys.stderr)
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
