"""`python -m bench_core ...`: see bench_core.cli."""

import sys

from .cli import main

sys.exit(main())
