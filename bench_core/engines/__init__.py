"""Engines by backend name: availability, validation, reuse key and loading.

Each engine module exposes the same four functions (`availability`, `validate`, `settings_key`,
`load`), imported lazily so that choosing one backend never imports another's libraries.
"""

from __future__ import annotations

import importlib

from ..config import BACKENDS, EngineConfig, LoadConfig
from ..errors import ConfigError, EngineUnavailable
from .base import Engine, EngineEvent, EngineInfo

_MODULES = {
    "transformers": ".transformers_engine",
    "turbomind": ".lmdeploy_engine",
    "pytorch": ".lmdeploy_engine",
    "openai": ".openai_engine",
}

__all__ = [
    "Engine",
    "EngineEvent",
    "EngineInfo",
    "availability",
    "engine_settings_key",
    "load_engine",
    "tokenizer_from_engine",
    "validate_engine_config",
]


def _module(backend: str):
    if backend not in _MODULES:
        raise ConfigError(f"Unknown backend '{backend}'; choose one of {', '.join(BACKENDS)}.")
    return importlib.import_module(_MODULES[backend], __name__)


def availability(backend: str) -> str | None:
    """None when `backend` can run on this machine, else the reason it cannot, for the user."""
    return _module(backend).availability(backend)


def validate_engine_config(engine: EngineConfig, load: LoadConfig) -> list[str]:
    """Problems with this backend's knobs, each a sentence for the user (LMDeploy's rules)."""
    return _module(engine.backend).validate(engine, load)


def engine_settings_key(engine: EngineConfig, load: LoadConfig) -> tuple:
    """Equal keys mean a loaded engine can be reused as it is."""
    return (engine.backend, *_module(engine.backend).settings_key(engine, load))


def tokenizer_from_engine(backend: str) -> bool:
    """True when prompts are sampled with the loaded engine's tokenizer, so the engine loads first: a
    server may name its model (and so its tokenizer) only when asked, and loading it costs nothing."""
    return getattr(_module(backend), "TOKENIZER_FROM_ENGINE", False)


def load_engine(engine: EngineConfig, load: LoadConfig) -> Engine:
    """Load the model behind `engine.backend`; raises EngineUnavailable or ModelError with a clear message."""
    reason = availability(engine.backend)
    if reason:
        raise EngineUnavailable(reason)
    return _module(engine.backend).load(engine, load)
