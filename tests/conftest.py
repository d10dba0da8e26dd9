"""Shared fixtures: real models and tokenizers that need no download."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """The built-in tiny Llama (random weights, BPE tokenizer, ChatML), built once per machine."""
    from bench_core.models import resolve_model

    return resolve_model("builtin:tiny-llama")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from bench_core.models import load_tokenizer

    return load_tokenizer("builtin:tiny-llama")
