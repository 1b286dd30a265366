import sys

from rossjax.bench import main

sys.exit(main())
