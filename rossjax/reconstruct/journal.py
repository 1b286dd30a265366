"""WORKDIR/journal.jsonl of `rossjax reconstruct`: a header line with the run's fingerprint, then
one line per settled artifact (record or reason, transcript). A rerun with the same fingerprint
settles those artifacts from it and asks nothing for them; other settings start it over. A line
cut off by a kill ends what is read: that artifact is asked again.
"""

from __future__ import annotations

import json
import os
import sys

JOURNAL = "journal.jsonl"
_ENTRY = ("row", "id", "sha", "status", "reason", "stage", "detail", "record", "failed_checks",
          "transcript")


class Journal:
    def __init__(self, workdir: str, fp: str):
        self.path = os.path.join(workdir, JOURNAL)
        self.done: dict = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
            try:
                head = json.loads(lines[0]) if lines else {}
            except ValueError:
                head = {}
            if isinstance(head, dict) and head.get("fingerprint") == fp:
                for ln in lines[1:]:
                    try:
                        e = json.loads(ln)
                        self.done[(e["row"], e["id"])] = {k: e[k] for k in _ENTRY}
                    except (ValueError, KeyError, TypeError):
                        break  # a line cut off by a kill: that artifact is asked again
            else:
                print(f"reconstruct: {self.path} was written with other settings; starting over",
                      file=sys.stderr)
        self.f = open(self.path + ".tmp", "w", encoding="utf-8")
        self.f.write(json.dumps({"fingerprint": fp}) + "\n")
        for e in self.done.values():
            self.f.write(json.dumps(e, ensure_ascii=False) + "\n")
        self.f.flush()
        os.replace(self.path + ".tmp", self.path)

    def add(self, entry: dict):
        self.f.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self):
        self.f.close()


def settled(workdir: str, fp: str) -> set | None:
    """(row, id, sha) of every artifact the journal settles, or None when there is no journal
    of fingerprint `fp` (none at all, another run's, or a torn line: then something is asked)."""
    path, done = os.path.join(workdir, JOURNAL), set()
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        for k, ln in enumerate(f):
            try:
                e = json.loads(ln)
            except ValueError:
                return None
            if k == 0 and (not isinstance(e, dict) or e.get("fingerprint") != fp):
                return None
            if k and isinstance(e, dict):
                done.add((e.get("row"), e.get("id"), e.get("sha")))
    return done
