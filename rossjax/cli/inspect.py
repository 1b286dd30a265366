"""`rossjax inspect DIR --id ID`: draw one compiled example so a person can check its mask by eye
(rossjax.curate.view)."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    from rossjax.curate.view import render_terminal, write_inspection

    ap = argparse.ArgumentParser(prog="rossjax inspect", description=__doc__.splitlines()[0])
    ap.add_argument("path", help="curated output dir, or a rollout .jsonl/.parquet file")
    ap.add_argument("--id", required=True, help="example id")
    ap.add_argument("--out", help="HTML file to write (default DIR/inspect/ID.html)")
    ap.add_argument("--tokenizer", help="tokenizer spec (default: the dir's, else qwen)")
    ap.add_argument("--template", default="chatml")
    ap.add_argument("--mask_mode", default="annotated")
    ap.add_argument("--no-color", action="store_true")
    args = ap.parse_args(argv)
    ex, tok, out = write_inspection(args.path, args.id, tokenizer=args.tokenizer,
                                    template=args.template, mask_mode=args.mask_mode, out=args.out)
    color = not args.no_color and sys.stdout.isatty()
    print(render_terminal(ex, tok, color=color))
    print(f"wrote {out}")
    return 0
