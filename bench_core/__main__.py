"""`python -m bench_core ...`: see bench_core.cli."""

import os
import sys

from .cli import main

code = main()
# Everything is written and said by now. Leave without the interpreter's teardown: it takes seconds once
# torch is imported, would wait on a model load that Ctrl-C left behind, and a second Ctrl-C during it
# prints a traceback.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
