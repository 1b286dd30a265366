"""Route fingerprints: a fixed-length vector for the structure of a reasoning trace.

A trace is split into steps by rule (paragraphs; lines when it has a single paragraph;
sentences when it has a single line; tool calls are steps of their own; pre-split steps are used
as given). Each step is labelled from the domain's step vocabulary (`step_vocab.STEP_VOCAB`, data
not code). Features, all independent of wording and of who wrote the trace:

- label histogram (fractions of steps);
- hashed label bigrams and trigrams (ordering), bucketed with a stable hash of the label names;
- path statistics: number of steps, backtracks, verifications, longest run of one label,
  relative position of the first verification, step-length statistics (log characters).

A fixed random projection (numpy PCG64(seed), so identical on every machine) maps the features to
`dim` float32 values. Speed: one precompiled regex, factored by the first character of each cue,
finds step boundaries and cues in a single pass (see _BOUNDARY); everything after that is
batched numpy.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import defaultdict
from typing import Sequence

import numpy as np

from rossjax.errors import InputError
from rossjax.routes.step_vocab import STEP_VOCAB

N_BIGRAM_BUCKETS = 128
N_TRIGRAM_BUCKETS = 256
N_STATS = 12
# Relative weights of the feature blocks before projection (the projection keeps distances).
_W_HIST, _W_BI, _W_TRI, _W_STATS = 1.0, 1.0, 1.0, 0.5

_PARA = re.compile(r"\n[ \t]*\n")
# Split mode -> boundary body. Every token the scanner looks for starts right after ONE consumed
# non-word character (the pattern opens with the class [^a-z_]), which lets the regex engine skip
# over all letters in C: the scan costs ~0.1 ms per 4,000-character trace. A boundary also
# captures the cue that opens the next step (`bc`), since it consumed that cue's lead character.
_BOUNDARY = {
    "para": r"(?<=\n)(?P<b>[ \t]*\n\s*)",
    "line": r"(?<=\n)(?P<b>\s*)",
    "sentence": r"(?<=[.!?])(?P<b>\s+)",
}


def _norm_cue(c: str) -> str:
    # A trailing space would swallow the lead character of the next cue: make it a lookahead.
    return c[:-1] + r"(?=\s|$)" if c.endswith(" ") else c


def _cue_groups(cues: list[str]) -> tuple[str, str]:
    r"""(word cues, punctuation/digit cues) as regex bodies that follow the consumed character.

    Word cues (starting with a letter, digit, space, quote or a `(` group of words) are grouped by
    their literal first character. A cue starting with an escaped punctuation character
    (`\\boxed`) or `\d` continues from that consumed character via a one-character lookbehind.
    """
    by_first, groups, punct = defaultdict(list), [], []
    for c in map(_norm_cue, cues):
        if re.match(r"[a-z0-9 ']", c) and (len(c) < 2 or c[1] not in "?*+{"):
            by_first[c[0]].append(c[1:])
        elif c.startswith("("):
            groups.append(c)
        elif re.match(r"\\[^a-zA-Z0-9]", c):
            punct.append("(?<=" + c[:2] + ")" + c[2:])
        elif c.startswith(r"\d"):
            rest = c[2:]
            punct.append("(?<=[0-9])" + ("[0-9]*" + rest[1:] if rest.startswith("+") else rest))
        else:
            raise ValueError(f"step cue {c!r} must start with a letter, digit, space, quote, a "
                             "(group), an escaped punctuation character or \\d.")
    word = "|".join([re.escape(k) + "(?:" + "|".join(v) + ")" for k, v in by_first.items()] + groups)
    return word, "|".join(punct)


class StepVocab:
    """A compiled step vocabulary: labels, a one-pass scanner per split mode, n-gram tables."""

    def __init__(self, domain: str, entries):
        if not entries:
            raise ValueError(f"step vocabulary for domain {domain!r} has no labels.")
        self.domain = domain
        self.labels = [lab for lab, _ in entries] + ["tool", "other"]
        self.tool_id, self.other_id = len(entries), len(entries) + 1
        self._label_rx = [re.compile("(?:" + "|".join(map(_norm_cue, cues)) + ")")
                          for _, cues in entries]
        self._memo: dict[str, int] = {}
        word, punct = _cue_groups([c for _, cues in entries for c in cues])
        tail = (f"|(?P<p>{punct})" if punct else "") + f"|(?P<c>{word}))"
        self.scanners = {
            mode: re.compile(
                rf"[^a-z_](?:(?<=\n)(?P<to>action:)|{b}(?P<bc>{word})?|(?<=<)(?P<tt>tool_call>)"
                rf"|(?<=<)(?P<tc>/tool_call>)" + tail)
            for mode, b in _BOUNDARY.items()}
        self.cue_only = re.compile(r"[^a-z_](?:(?<=<)(?P<tt>tool_call>)" + tail)
        names = self.labels
        L = len(names)
        self.bi_table = np.array([[_bucket(f"{a}>{b}", N_BIGRAM_BUCKETS) for b in names]
                                  for a in names], np.int64)
        self.tri_table = np.array([[[_bucket(f"{a}>{b}>{c}", N_TRIGRAM_BUCKETS) for c in names]
                                    for b in names] for a in names], np.int64)
        self.n_labels = L
        self.verify_id = self.labels.index("verify") if "verify" in self.labels else -1
        self.backtrack_id = self.labels.index("backtrack") if "backtrack" in self.labels else -1

    def label_of(self, cue_text: str) -> int:
        """Highest-priority label whose cues fully match this matched cue text."""
        lab = self._memo.get(cue_text)
        if lab is None:
            lab = next((i for i, rx in enumerate(self._label_rx) if rx.fullmatch(cue_text)),
                       self.other_id)
            self._memo[cue_text] = lab
        return lab


def _bucket(key: str, n: int) -> int:
    # Stable across processes and machines (Python's hash() is salted).
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % n


@functools.lru_cache(maxsize=None)
def get_vocab(domain: str) -> StepVocab:
    if domain not in STEP_VOCAB:
        raise InputError(f"unknown fingerprint domain {domain!r}; known: {sorted(STEP_VOCAB)}.")
    return StepVocab(domain, STEP_VOCAB[domain])


def route_steps(text, vocab: StepVocab) -> tuple[list[int], list[int]]:
    """(label ids, step lengths in characters) of one trace; `text` may be a list of steps."""
    label_of, other = vocab.label_of, vocab.other_id
    if not isinstance(text, str):
        ids, lens = [], []
        for step in text:
            low = " " + str(step).lower()   # the lead space lets a cue open the step
            if not low.strip():
                continue
            best, tool = other, False
            for m in vocab.cue_only.finditer(low):
                g = m.lastgroup
                if g == "tt":
                    tool = True
                else:
                    best = min(best, label_of(m.group("c") if g == "c" else m.group()))
            ids.append(vocab.tool_id if tool and best == other else best)
            lens.append(len(low) - 1)
        return ids, lens
    low = " " + text.lower()
    mode = "para" if _PARA.search(low) else ("line" if "\n" in low.strip() else "sentence")
    ids, lens = [], []
    start, best, tool = 1, other, False

    def close(end):
        if end > start and (best != other or tool or low[start:end].strip()):
            ids.append(vocab.tool_id if tool and best == other else best)
            lens.append(end - start)

    for m in vocab.scanners[mode].finditer(low):
        g = m.lastgroup
        if g == "c":
            lab = label_of(m.group("c"))
            if lab < best:
                best = lab
        elif g == "p":
            lab = label_of(m.group())
            if lab < best:
                best = lab
        elif g == "b" or g == "bc":
            close(m.start() + (mode == "sentence"))   # a sentence keeps its full stop
            start, best, tool = m.end("b"), other, False
            if g == "bc":
                best = label_of(m.group("bc"))
        elif g == "tc":  # the closing tag belongs to the tool step just closed
            close(m.end())
            start, best, tool = m.end(), other, False
        else:  # "tt" / "to": a tool call opens a step of its own
            close(m.start())
            start, best, tool = m.start(), other, True
    close(len(low))
    return ids, lens


def _validate(texts, offset: int = 0) -> None:
    for i, t in enumerate(texts, start=offset):
        steps = [t] if isinstance(t, str) else list(t)
        if not any(isinstance(s, str) and s.strip() for s in steps):
            raise InputError(f"texts[{i}] is empty or only whitespace; a route needs at least one step.")


def _features(routes: list[tuple[list[int], list[int]]], vocab: StepVocab) -> np.ndarray:
    n = len(routes)
    L = vocab.n_labels
    counts = np.array([len(r[0]) for r in routes], np.int64)
    ids = np.fromiter((x for r in routes for x in r[0]), np.int64, int(counts.sum()))
    lens = np.fromiter((x for r in routes for x in r[1]), np.float64, int(counts.sum()))
    row = np.repeat(np.arange(n), counts)
    offs = np.concatenate([[0], np.cumsum(counts)])
    pos = np.arange(len(ids)) - offs[row]          # step index inside its trace
    nf = counts.astype(np.float64)

    hist = np.bincount(row * L + ids, minlength=n * L).reshape(n, L) / nf[:, None]

    def grams(k, table, nb):
        ok = pos >= k - 1
        if k == 2:
            b = table[ids[np.flatnonzero(ok) - 1], ids[ok]]
        else:
            j = np.flatnonzero(ok)
            b = table[ids[j - 2], ids[j - 1], ids[j]]
        out = np.bincount(row[ok] * nb + b, minlength=n * nb).reshape(n, nb).astype(np.float64)
        return out / np.maximum(nf - (k - 1), 1)[:, None]

    bi = grams(2, vocab.bi_table, N_BIGRAM_BUCKETS)
    tri = grams(3, vocab.tri_table, N_TRIGRAM_BUCKETS)

    is_v = ids == vocab.verify_id
    is_b = ids == vocab.backtrack_id
    n_v = np.bincount(row, weights=is_v, minlength=n)
    n_b = np.bincount(row, weights=is_b, minlength=n)
    first_v = np.full(n, np.inf)
    np.minimum.at(first_v, row[is_v], pos[is_v].astype(np.float64))
    first_v_rel = np.where(np.isfinite(first_v), first_v / nf, 1.0)
    # longest run of one label: run starts where the label or the trace changes
    new_run = np.ones(len(ids), bool)
    new_run[1:] = (ids[1:] != ids[:-1]) | (row[1:] != row[:-1])
    run_starts = np.flatnonzero(new_run)
    run_len = np.diff(np.append(run_starts, len(ids)))
    longest = np.zeros(n)
    np.maximum.at(longest, row[run_starts], run_len)
    ll = np.log1p(lens)
    mean_ll = np.bincount(row, weights=ll, minlength=n) / nf
    var_ll = np.maximum(np.bincount(row, weights=ll * ll, minlength=n) / nf - mean_ll ** 2, 0)
    min_ll = np.full(n, np.inf)
    np.minimum.at(min_ll, row, ll)
    max_ll = np.zeros(n)
    np.maximum.at(max_ll, row, ll)
    stats = np.stack([
        np.log1p(nf) / 4, np.log1p(n_b) / 2, n_b / nf, np.log1p(n_v) / 2, n_v / nf,
        longest / nf, np.log1p(longest) / 3, first_v_rel, (n_v > 0).astype(np.float64),
        (mean_ll - 4.5) / 2, np.sqrt(var_ll) / 2, (max_ll - min_ll) / 4], axis=1)
    return np.concatenate([_W_HIST * hist, _W_BI * bi, _W_TRI * tri, _W_STATS * stats], axis=1)


@functools.lru_cache(maxsize=16)
def projection(n_features: int, dim: int, seed: int) -> np.ndarray:
    """The fixed [n_features, dim] float32 projection for `seed` (PCG64: same on any machine)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    w = rng.standard_normal((n_features, dim), dtype=np.float32)
    return w / np.float32(np.sqrt(dim))


def route_signature(ids: Sequence[int], vocab: StepVocab) -> int:
    """Stable 63-bit id of a label sequence (the route topology, lengths ignored)."""
    key = ">".join(vocab.labels[i] for i in ids)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def fingerprint(texts, domain: str = "math", dim: int = 64, seed: int = 0, *,
                return_routes: bool = False):
    """Route fingerprints of `texts` -> float32 [len(texts), dim].

    Each item is a trace string or a list of pre-split step strings (a record's own step
    annotations). With `return_routes=True` also returns int64 route signatures (one per
    distinct label sequence), used by `select(..., method="topology")`.
    Raises ValueError for an empty or whitespace-only trace, an unknown domain, or dim < 1.
    """
    if isinstance(texts, str):
        raise InputError("fingerprint expects a list of traces, got a single string.")
    if int(dim) < 1:
        raise InputError(f"fingerprint dim must be >= 1, got {dim}.")
    vocab = get_vocab(domain)
    texts = list(texts)
    _validate(texts)
    routes = [route_steps(t, vocab) for t in texts]
    if not texts:
        out = np.zeros((0, dim), np.float32)
        return (out, np.zeros(0, np.int64)) if return_routes else out
    feats = _features(routes, vocab)
    # float64 product rounded to float32: BLAS summation order differs between machines, and
    # float64 keeps those differences far below float32 resolution.
    w = projection(feats.shape[1], int(dim), int(seed)).astype(np.float64)
    out = (feats @ w).astype(np.float32)
    if return_routes:
        return out, np.array([route_signature(r[0], vocab) for r in routes], np.int64)
    return out


def trace_text(record: dict):
    """The solver's route in a rollout record: its own `steps` list when present, else the
    assistant turns (reasoning, content, tool calls as `<tool_call>` steps) joined by blank lines."""
    if isinstance(record.get("steps"), list) and record["steps"]:
        return [str(s) for s in record["steps"]]
    parts = []
    for m in record.get("messages") or []:
        if m.get("role") != "assistant":
            continue
        for key in ("reasoning", "content"):
            if isinstance(m.get(key), str) and m[key].strip():
                parts.append(m[key].strip())
        for call in m.get("tool_calls") or []:
            parts.append("<tool_call>" + json.dumps(call, sort_keys=True) + "</tool_call>")
    return "\n\n".join(parts)


def _fingerprint_job(args):
    texts, domain, dim, seed = args
    return fingerprint(texts, domain, dim, seed, return_routes=True)


def fingerprint_many(texts, domain: str = "math", dim: int = 64, seed: int = 0, *,
                     chunk: int = 4096, workers: int = 0, progress: bool = False):
    """`fingerprint(texts, ..., return_routes=True)` for large pools: in chunks (each row's vector
    depends on that row only, so the result is identical), over `workers` spawned processes when
    > 0, with a tqdm bar when `progress`. `texts` may be a generator: it is read chunk by chunk
    and at most 2 x workers chunks are in flight, so a pool of millions never sits in memory as
    text. Returns (float32 [n, dim], int64 [n] route signatures)."""
    import collections
    import itertools
    import multiprocessing as mp
    import sys

    from tqdm import tqdm

    get_vocab(domain)  # bad input fails here, before any worker starts
    whole = isinstance(texts, (list, tuple))
    if whole:
        _validate(texts)  # a list is checked whole up front; a stream chunk by chunk below
    it = iter(texts)

    def jobs():
        start = 0
        while block := list(itertools.islice(it, chunk)):
            if not whole:
                _validate(block, start)
            yield block, domain, dim, seed
            start += len(block)

    fps, sigs = [np.zeros((0, int(dim)), np.float32)], [np.zeros(0, np.int64)]
    gen = jobs()
    head = list(itertools.islice(gen, 2))        # one chunk only: no processes to spawn
    total = len(texts) if hasattr(texts, "__len__") else None
    with tqdm(total=total, unit="trace", desc="fingerprint", disable=not progress,
              file=sys.stderr) as bar:
        def done(f, r):
            fps.append(f), sigs.append(r), bar.update(len(r))

        if workers > 0 and len(head) > 1:
            # spawn: fresh workers, no inherited BLAS threads or parent memory
            with mp.get_context("spawn").Pool(workers) as pool:
                flying = collections.deque()
                for job in itertools.chain(head, gen):
                    flying.append(pool.apply_async(_fingerprint_job, (job,)))
                    if len(flying) >= 2 * workers:
                        done(*flying.popleft().get())
                while flying:
                    done(*flying.popleft().get())
        else:
            for job in itertools.chain(head, gen):
                done(*_fingerprint_job(job))
    return np.concatenate(fps), np.concatenate(sigs)
