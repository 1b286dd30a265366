import sys

from rossjax.cli import main

sys.exit(main())
