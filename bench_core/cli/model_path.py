"""`python -m bench_core model-path NAME`: print the local folder of a built-in model, building it if needed."""

from __future__ import annotations

import argparse

from .common import EXIT_OK, Command


class ModelPathCommand(Command):
    name = "model-path"
    help = "print the local folder of a built-in model, building it if needed"
    epilog = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="builtin:smollm2-135m or builtin:tiny-llama")

    def run(self, args: argparse.Namespace) -> int:
        from ..models import resolve_model

        print(resolve_model(args.name))
        return EXIT_OK
