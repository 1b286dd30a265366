"""On-policy distillation losses (a registry, `config.distill.loss`): per-token reverse KL of a
student against a frozen teacher, on tokens the student sampled, plus the checks that make a
teacher usable (same tokenizer) and the routing of rows to teachers (multi-teacher, by a field).

A loss is `fn(student_logits, teacher_logits, targets, temperature) -> [B, T]` float: logits
[B, T, V] at the positions that predict `targets` [B, T] (the sampled ids); only the student's
logits carry a gradient. Both distributions are softmax(logits / T) at the sampling
temperature T, as GRPO's log-probs are, so the KL compares the distribution sampled from.
`distill_loss` masks the per-token terms and reduces them with a registered aggregation
(rossjax.train.rl.aggregation), so micro-batches add up as they do in GRPO.

- `reverse_kl_sampled`: the sampled-token estimator. Value: k1 = log pi_s(y) - log pi_t(y),
  unbiased for the per-token KL(pi_s || pi_t) on the student's own samples. Gradient: the
  policy-gradient form sg(k1) * grad log pi_s(y), i.e. a per-token advantage -(log pi_s -
  log pi_t) with no future terms (discount 0), as Thinking Machines' on-policy distillation
  describes it (not checked against its code). Why this form: differentiating k1 itself gives
  grad log pi_s(y), whose expectation under pi_s is 0, so it would not minimise the KL at all;
  the score-function form is the unbiased estimate of the KL's gradient. Needs only the
  teacher's log-prob of the sampled token, which is what history rows carry.
- `reverse_kl_full`: sum_v pi_s(v) (log pi_s(v) - log pi_t(v)) at each position, exact and
  differentiated directly (TRL GKD's generalized JSD at beta = 1, its reverse-KL end); lower
  variance, but it needs the teacher's full logits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp

from rossjax.errors import ConfigError, InputError
from rossjax.train.registry import Registry
from rossjax.train.rl.aggregation import AGGREGATION_REGISTRY, masked

DISTILL_REGISTRY = Registry("distillation loss", "config.distill.loss")


def _logsoftmax(logits, temperature):
    """log softmax(logits / T) in at least float32 (float64 stays float64, for exact tests)."""
    if not temperature > 0:
        raise ConfigError(f"config.distill.temperature {temperature!r} must be > 0 (use 1.0 "
                          "for greedy sampling, as GRPO does).")
    x = jnp.asarray(logits)
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return jax.nn.log_softmax(x / temperature, axis=-1)


def _token_logp(logp, targets):
    return jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], axis=-1)[..., 0]


@DISTILL_REGISTRY.register("reverse_kl_sampled")
def reverse_kl_sampled(student_logits, teacher_logits, targets, temperature=1.0):
    """Per token: value log pi_s(y) - log pi_t(y), gradient sg(that) * grad log pi_s(y)
    (the score-function form; see module doc for why not the pathwise one)."""
    lps = _token_logp(_logsoftmax(student_logits, temperature), targets)
    lpt = _token_logp(_logsoftmax(teacher_logits, temperature), targets)
    return reverse_kl_sampled_logp(lps, lpt)


def reverse_kl_sampled_logp(student_logp, teacher_logp):
    """reverse_kl_sampled from the sampled tokens' log-probs [B, T] (at the sampling
    temperature) instead of logits: what the trainer runs, from the chunked LM head and the
    teacher log-probs its one scoring pass stored (no [B, T, V] tensor)."""
    lps = jnp.asarray(student_logp)
    k1 = jax.lax.stop_gradient(lps - jnp.asarray(teacher_logp))
    # value k1 (the + lps - sg(lps) is 0), gradient k1 * d lps: the advantage-weighted form
    return k1 + k1 * (lps - jax.lax.stop_gradient(lps))


# Losses that need only the sampled tokens' log-probs: name -> fn(student_logp, teacher_logp)
# -> [B, T]. A registry name absent here (reverse_kl_full, a user's module:function) gets the
# full [B, T, V] logits of student and teacher (rossjax/train/rl/distill_step.py).
TOKEN_FORMS = {"reverse_kl_sampled": reverse_kl_sampled_logp}


@DISTILL_REGISTRY.register("reverse_kl_full")
def reverse_kl_full(student_logits, teacher_logits, targets, temperature=1.0):
    """Per position: sum_v pi_s(v) (log pi_s(v) - log pi_t(v)), the exact reverse KL."""
    lps = _logsoftmax(student_logits, temperature)
    lpt = jax.lax.stop_gradient(_logsoftmax(teacher_logits, temperature))
    return (jnp.exp(lps) * (lps - lpt)).sum(axis=-1)


def distill_loss(name: str, student_logits, teacher_logits, targets, mask, *,
                 temperature: float = 1.0, agg: str = "token_mean", denom=None, max_len=None):
    """(loss, per-token terms [B, T] masked): the loss `name` reduced by aggregation `agg`.
    `denom` is the whole batch's (aggregation.normalizers) when this is one micro-batch."""
    per_token = DISTILL_REGISTRY.get(name)(student_logits, teacher_logits, targets, temperature)
    mask = jnp.asarray(mask, per_token.dtype)
    a = AGGREGATION_REGISTRY.get(agg)
    if denom is None:
        denom = a.denominator(mask, max_len)
    return a(per_token, mask, denom), masked(per_token, mask)


# -- teachers ---------------------------------------------------------------------------------

def tokenizer_fingerprint(tok) -> str:
    """sha256 of what makes two tokenizers interchangeable for distillation: every token's bytes
    by id, the special tokens' names and ids, and the eos / pad ids."""
    h = hashlib.sha256()
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        h.update(len(b).to_bytes(4, "little") + b)
    for name, i in sorted(tok.special_tokens.items()):
        h.update(f"\0{name}\0{i}".encode())
    h.update(f"\0eos={tok.eos_id}\0pad={tok.pad_id}".encode())
    return h.hexdigest()


def _tokenizer_difference(s, t) -> str | None:
    """What differs between tokenizers s (student) and t (teacher), as a clause, or None."""
    if s.vocab_size != t.vocab_size:
        return f"a vocabulary of {t.vocab_size} tokens against the student's {s.vocab_size}"
    first = next((i for i in range(s.vocab_size) if s.token_bytes(i) != t.token_bytes(i)), None)
    if first is not None:
        return (f"token {first} spelled {t.token_bytes(first)!r} against the student's "
                f"{s.token_bytes(first)!r}")
    if s.special_tokens != t.special_tokens:
        names = sorted(set(s.special_tokens.items()) ^ set(t.special_tokens.items()))
        return f"different special tokens ({', '.join(f'{n}={i}' for n, i in names[:4])})"
    if (s.eos_id, s.pad_id) != (t.eos_id, t.pad_id):
        return (f"eos/pad ids {t.eos_id}/{t.pad_id} against the student's "
                f"{s.eos_id}/{s.pad_id}")
    return None if tokenizer_fingerprint(s) == tokenizer_fingerprint(t) else "another fingerprint"


def check_teacher(student: str, student_tokenizer, teacher: str, teacher_tokenizer) -> str:
    """The shared tokenizer fingerprint, or ConfigError when the teacher's tokenizer differs.

    Per-token log-probs compare only over the same token ids, so the tokenizers must match;
    the architecture family may differ (it is not looked at). Tokenizers are any spec
    rossjax.tokenizers.load_tokenizer takes (a name, a path, a dict or a Tokenizer)."""
    from rossjax.tokenizers import load_tokenizer

    s, t = load_tokenizer(student_tokenizer), load_tokenizer(teacher_tokenizer)
    why = _tokenizer_difference(s, t)
    if why:
        raise ConfigError(f"teacher {teacher!r} cannot distill into student {student!r}: its "
                          f"tokenizer has {why}, and per-token KL needs the same tokenizer.")
    return tokenizer_fingerprint(s)


def route_rows(rows: Iterable[Mapping], routes: Mapping[str, str], field: str = "domain",
               source: str = "the rows", default: str = "") -> list[str]:
    """The teacher name of each row: routes[row[field]]. A row whose field is missing or names
    no route goes to the `default` teacher when one is named; with none it is refused
    (InputError), never sent to some teacher by guess."""
    out = []
    for i, row in enumerate(rows):
        value = row.get(field) if isinstance(row, Mapping) else None
        if default and not (isinstance(value, str) and value in routes):
            out.append(default)
            continue
        if not isinstance(value, str) or value not in routes:
            known = ", ".join(sorted(routes)) or "none"
            raise InputError(f"{source} row {i}: field {field!r} = {value!r} names no teacher "
                             f"(routes: {known}).")
        out.append(routes[value])
    return out


def rows_by_teacher(teachers: Sequence[str]) -> dict[str, list[int]]:
    """teacher name -> indices of its rows, in first-seen order: one teacher forward per name."""
    out: dict[str, list[int]] = {}
    for i, name in enumerate(teachers):
        out.setdefault(name, []).append(i)
    return out
