"""The single-turn procedure: proposal, deterministic checks, audit, repair (docs/review.md).

  proposal  the judge chooses whole response / ordered keep spans / reject, with verbatim
            unique start and end anchors and a reason per span, plus the paper's outputs: the
            whole_clean and clean_solution flags, what was left out, risk tags. Redundancy alone
            is not an error; the kept text must be self-contained (dependencies and the
            derivation of the answer present);
  checks    after every proposal or revision (checks.check_proposal): anchors resolve with
            curate's compiler, spans in source order and disjoint, inside the assistant
            response, and the selected text contains the complete final answer; a failure is
            asked again with the failing check quoted (config.max_step_retries);
  audit     a separate request judges the exact selected text (spans concatenated in order),
            not the proposal's own account of it: errors, missing dependencies, a missing
            derivation; its outcome is the paper's accept (keep the selection), revise (the
            errors go to repair) or drop (no clean selection exists: the row is withheld as
            `audit_drop` with the audit's reason, nothing more is asked);
  repair    an audit that asks for a revision gets a revision request carrying the evidence; the
            revision is checked and audited again, for at most config.max_repair_rounds rounds.
            Every error an audit quotes from the selection is confirmed at its place, and the
            deterministic acceptance check refuses any later revision that still keeps it.
            A rejected revision, or errors still found after the last round, withhold the row
            as `annotation_drop`: the text is never patched with anything the model did not say.

A proposal that rejects the rollout withholds it as `reviewer_drop`; a proposal that never
passes the checks, with the code of its last failed check.
"""

from __future__ import annotations

from rossjax.review import prompts
from rossjax.review.checks import answer_interval, check_audit, check_proposal, confirmed_errors
from rossjax.review.steps import Row, RowWithheld


def review_single_turn(row: Row, max_repair_rounds: int) -> dict:
    """The annotation for a single-turn row, or `RowWithheld`."""
    rec, r = row.record, row.rendered
    ans = answer_interval(r, rec)
    confirmed = []  # errors audits found in the selections they were shown, by position

    def checked(obj):
        return check_proposal(obj, rec, r, row.compile_, confirmed)

    base = prompts.proposal(rec, r, ans[1] if ans else None)
    prop, text = row.ask("proposal", base, checked)
    if prop.decision == "reject":
        raise RowWithheld("reviewer_drop", f"the reviewer rejected this rollout: "
                                           f"{prop.reason or 'no reason given'}", "proposal")
    for round_ in range(max_repair_rounds + 1):
        (outcome, errors, why), _ = row.ask("audit", prompts.audit(rec, prop.selected),
                                            check_audit)
        row.outcomes[f"audit:{outcome}"] += 1
        if outcome == "drop":
            raise RowWithheld("audit_drop", f"the audit dropped this rollout: {why}"[:400], "audit")
        if outcome == "accept":
            ann = dict(prop.annotation)
            if round_:
                ann["status"] = "revise"  # repaired: the kept text differs from the proposal
            return {"annotation": ann, "reason": prop.reason, "repair_rounds": round_,
                    "proposal": prop.outputs,
                    "excluded_errors": sorted({c.quote for c in confirmed})}
        confirmed += confirmed_errors(errors, r, prop.body)
        if round_ == max_repair_rounds:
            break
        try:
            prop, text = row.ask("repair", prompts.repair(base, text, errors), checked)
        except RowWithheld as e:  # no revision passes the checks: nothing clean to keep
            raise RowWithheld("annotation_drop", f"the repair never passed the checks: "
                                                 f"{e.detail}", "repair") from None
        if prop.decision == "reject":
            raise RowWithheld("annotation_drop", f"the repair found no clean selection: "
                                                 f"{prop.reason or 'no reason given'}", "repair")
    problems = "; ".join(e["problem"] for e in errors)[:300]
    raise RowWithheld("annotation_drop", f"the audit still finds errors after "
                                         f"{max_repair_rounds} repair round(s): {problems}",
                      "repair" if max_repair_rounds else "audit")
