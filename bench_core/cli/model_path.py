"""`python -m bench_core model-path NAME`: print the local folder of a built-in or synthetic model, building it
if needed (a synthetic one in bf16, once: the folder to hand to a server)."""

from __future__ import annotations

import argparse

from ..models.synthetic import SYNTHETIC_MODELS
from .common import EXIT_OK, Command


class ModelPathCommand(Command):
    name = "model-path"
    help = "print the local folder of a built-in or synthetic model, building it if needed"
    epilog = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "name",
            help="builtin:smollm2-135m, builtin:tiny-llama, or synthetic:<preset> "
            f"({', '.join(SYNTHETIC_MODELS)}), a preset with sizes changed "
            "(synthetic:llama-3.2-1b:layers=4) or a custom shape "
            "(synthetic:llama:layers=..,hidden=..,intermediate=..,heads=..,kv_heads=..,"
            "vocab=..)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ..models.resolve import resolve_model

        print(resolve_model(args.name))
        return EXIT_OK
