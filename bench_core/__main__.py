"""`python -m bench_core ...`: see bench_core.cli."""

from .cli import main_and_exit

main_and_exit()
