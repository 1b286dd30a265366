import sys

from rossjax.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))  # `python -m rossjax.bench X` == `rossjax bench X`
