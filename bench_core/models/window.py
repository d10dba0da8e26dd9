"""A model's context window, read cheaply: from what we know of built-in and synthetic models, else from the
config.json of a local folder or a cached hub id, without loading weights or building anything."""

from __future__ import annotations

import json
from pathlib import Path

from .resolve import CACHED_MODEL_PREFIXES, known_context_window, local_folder

WINDOW_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def model_context_window(name: str) -> int | None:
    """Tokens of context the model named `name` holds; None when unknown (an unreadable or absent config)."""
    name = str(name).strip()
    if name.startswith(CACHED_MODEL_PREFIXES):
        return known_context_window(name)
    path = _config_path(name)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # loading the model will say what is wrong with it
    return window_of(config)


def window_of(config: dict) -> int | None:
    """The window a Hugging Face config.json declares, at its top level or in its text model's part."""
    for part in (config, config.get("text_config") or {}):
        for key in WINDOW_KEYS:
            value = part.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _config_path(name: str) -> Path | None:
    folder = local_folder(name)
    if folder is not None:
        path = folder / "config.json"
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid hub id: loading the model will say so
        return None
    return Path(cached) if isinstance(cached, str) else None
