"""The agentic procedure: semantic discovery, then boundary localization (docs/review.md).

  discovery     over the rollout's own assistant steps in groups of config.step_group steps,
                one request per group: every call judged on the four axes (contract,
                operation, environment, execution) plus the narrative and causal checks, every
                line of every step's text parts given a verdict (ok / fail / unresolved), and
                the findings listed: present errors, omissions, unresolved claims; no text
                boundaries yet. Checked for coverage (every call, every line exactly once) and
                consistency (agentic_checks.check_discovery, check_lines); a failure is asked again
                with the failing check quoted.
  unresolved    a finding the reviewer cannot settle withholds the row (`review_unresolved`)
                as soon as its group is checked: nothing is guessed, and no boundary is asked
                for a row that will not be trained on.
  localization  one request per error or omission: message, 1-based line, verbatim quote,
                0-based occurrence, protect regions. Selectors must resolve, an error's
                exclusions lie in its own message, and no exclusion overlaps a protected region
                of this or an earlier finding (agentic_checks.check_localization); a failure is asked
                again with the failing check quoted. A localizer that answers "unresolved"
                (the finding's text cannot be pointed to) withholds the row
                (`localization_unresolved`), as the paper's localizer does: nothing is guessed.
  annotation    exclude (errors), protect, omissions (recorded, no mask effect); status accept
                when nothing is excluded, else revise; compiled once more with curate's
                compiler before it is kept.
"""

from __future__ import annotations

from rossjax.review import prompts
from rossjax.review.agentic_checks import check_discovery, check_localization
from rossjax.review.render import step_groups
from rossjax.review.steps import Row, RowWithheld


def review_agentic(row: Row, step_group: int) -> dict:
    """The annotation for an agentic row, or `RowWithheld`."""
    rec, r = row.record, row.rendered
    findings = []
    for group in step_groups(rec, step_group):
        found, _ = row.ask("discovery", prompts.discovery(rec, r, group),
                           lambda obj, g=group: check_discovery(obj, g, r))
        open_ = [f for f in found if f["kind"] == "unresolved"]
        if open_:
            f = open_[0]
            raise RowWithheld("review_unresolved",
                              f"message {f['message']} call {f['call']} ({', '.join(f['axes'])}) "
                              f"is unresolved: {f['what']}"[:400], "discovery")
        findings += found
    done = {"exclude": [], "protect": []}
    omissions = []
    for f in findings:
        loc, _ = row.ask("localization", prompts.localization(rec, r, f),
                         lambda obj, f=f: check_localization(obj, f, r, done))
        if "unresolved" in loc:
            row.outcomes["localization:unresolved"] += 1
            raise RowWithheld("localization_unresolved",
                              f"the localizer could not locate the {f['kind']} of message "
                              f"{f['message']} call {f['call']}: {loc['unresolved']}"[:400],
                              "localization")
        row.outcomes["localization:located"] += 1
        done["exclude"] += loc["exclude"]
        done["protect"] += loc["protect"]
        if loc["omission"]:
            omissions.append(loc["omission"])
    ann = {"status": "revise" if done["exclude"] else "accept"}
    for key in ("exclude", "protect"):
        if done[key]:
            ann[key] = [sel for sel, _ in done[key]]
    if omissions:
        ann["omissions"] = omissions
    ex = row.compile_({**rec, "annotation": ann})
    if ex.status != "kept":  # e.g. the exclusions leave no supervised token
        raise RowWithheld(ex.reason, ex.detail, "localization")
    n_err = sum(f["kind"] == "error" for f in findings)
    return {"annotation": ann, "findings": findings,
            "reason": f"{n_err} error(s), {len(findings) - n_err} omission(s) over "
                      f"{len(step_groups(rec, step_group))} step group(s)"}
