"""The recipe check `rossjax train` runs before the trainer's own: a curated dir made for another
recipe names the one-flag fix on the train command (`--config.recipe=NAME`), not a re-curate."""

from __future__ import annotations

import json
import os

from rossjax.defaults import RECIPES
from rossjax.errors import InputError


def curated_for(report: dict) -> str:
    """The recipe a report.json's curate run was made for: its `config.recipe`, else the one
    recipe whose curate fields it has ("" when none or several fit)."""
    conf = report.get("config") or {}
    if conf.get("recipe") in RECIPES:
        return conf["recipe"]
    fits = [name for name, r in RECIPES.items()
            if all((report.get(k) or conf.get(k)) == v for k, v in
                   dict(rows=r["rows"], mask_mode=r["mask_mode"], **r.get("curate", {})).items())]
    return fits[0] if len(fits) == 1 else ""


def check_train_recipe(cfg) -> None:
    """Raise when a `data.train` dir was curated for a recipe whose rows or mask differ from
    `cfg.recipe`'s, naming both fixes; anything else is left to the trainer's check."""
    want = RECIPES.get(cfg.get("recipe", ""))
    if want is None:
        return
    for path in [p for p in str(cfg.data.train).split(",") if p]:
        report = os.path.join(path, "report.json")
        if not os.path.isfile(report):
            continue
        with open(report, encoding="utf-8") as f:
            rep = json.load(f)
        conf = rep.get("config") or {}
        differs = [k for k in ("mask_mode", "rows")
                   if (rep.get(k) or conf.get(k)) not in (None, "", want[k])]
        made_for = curated_for(rep)
        if differs and made_for and made_for != cfg.recipe:
            got = ", ".join(f"{k}={rep.get(k) or conf.get(k)}" for k in differs)
            raise InputError(f"{report}: curated for recipe {made_for!r} ({got}) but this run's "
                             f"recipe is {cfg.recipe!r}; train it with --config.recipe={made_for} "
                             f"(or curate again with --config.recipe={cfg.recipe}).")
