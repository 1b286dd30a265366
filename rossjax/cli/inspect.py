"""`rossjax inspect DIR --id ID`: draw one compiled example so a person can check its mask by eye
(rossjax.curate.view); `rossjax inspect DIR --list` lists every id there (kept with its token
counts, withheld or invalid with its reason) to pick one from."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    from rossjax.curate.view import html_name, render_terminal, write_inspection

    ap = argparse.ArgumentParser(prog="rossjax inspect", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("path", help="curated output dir, or a rollout .jsonl/.parquet file")
    ap.add_argument("--id", help="example id (see --list)")
    ap.add_argument("--list", action="store_true", help="list the ids (kept, withheld, invalid) "
                                                        "instead of drawing one")
    ap.add_argument("--out", help="HTML file to write the view to (default: WORKDIR/ID.html "
                                  "with --workdir, else none: the terminal view only)")
    ap.add_argument("--workdir", help="folder for the HTML view (never the data folder)")
    ap.add_argument("--tokenizer", help="tokenizer spec (default: the dir's, else qwen)")
    ap.add_argument("--template", default="chatml")
    ap.add_argument("--mask_mode", default="annotated")
    ap.add_argument("--no-color", action="store_true")
    ap.add_argument("--review", help="rossjax review WORKDIR whose transcripts.jsonl holds this "
                                     "row's reviewer requests and answers (default: the rollout "
                                     "file's directory when it has one)")
    args = ap.parse_args(argv)
    if args.list:
        from rossjax.curate.view import format_list, list_examples

        print(format_list(list_examples(args.path)))
        return 0
    if not args.id:
        from rossjax.errors import UsageError

        raise UsageError("rossjax inspect: give --id ID (one example) or --list (every id)")
    if args.workdir and not args.out:
        args.out = os.path.join(args.workdir, html_name(args.id))
    ex, tok, out = write_inspection(args.path, args.id, tokenizer=args.tokenizer,
                                    template=args.template, mask_mode=args.mask_mode, out=args.out)
    color = not args.no_color and sys.stdout.isatty()
    print(render_terminal(ex, tok, color=color))
    review_dir = args.review or (os.path.dirname(os.path.abspath(args.path))
                                 if os.path.isfile(args.path) else None)
    if review_dir:
        from rossjax.review.transcripts import format_transcript, read_transcript

        t = read_transcript(review_dir, args.id)
        if t is not None:
            print(format_transcript(t))
        elif args.review:
            print(f"no review transcript of {args.id} in {review_dir}")
    print(f"wrote {out}" if out else "(an HTML view: --workdir=DIR or --out=FILE.html)")
    return 0
