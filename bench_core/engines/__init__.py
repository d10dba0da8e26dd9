"""Engines by backend name: the registry of `Backend` classes, and the run-config check that needs them.

A backend registers by being defined in a module of this package whose name ends in `_engine`: the
registry imports those modules (and only those) the first time a backend is asked for, and indexes
their `Backend` classes by the names they declare. Backend modules import their heavy libraries only
where they load or run, so asking about one backend never imports another's torch, lmdeploy or transformers.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

from ..config import BackendRules, EngineConfig, LoadConfig, Part, RunConfig, validate_run_config
from ..config.validation import setting_problems
from ..errors import ConfigError, EngineUnavailable
from ..load import dataset, dataset_rules
from ..states import LoadPattern
from .base import Backend, Engine, EngineEvent, EngineInfo
from .engine_api import uvloop_problem

BACKEND_MODULE_SUFFIX = "_engine"

__all__ = [
    "Backend",
    "Engine",
    "EngineEvent",
    "EngineInfo",
    "availability",
    "backend",
    "backends",
    "check_run_config",
    "context_window",
    "in_process_backends",
    "engine_settings_key",
    "load_engine",
    "run_config_problems",
    "tokenizer_from_engine",
    "validate_engine_config",
]


@functools.cache
def _registry() -> dict[str, type[Backend]]:
    """Every backend name, in the order the backends are listed (their `order`)."""
    found: dict[str, type[Backend]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        if not module_info.name.endswith(BACKEND_MODULE_SUFFIX):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for cls in vars(module).values():
            if (
                isinstance(cls, type)
                and issubclass(cls, Backend)
                and cls.__module__ == module.__name__
                and not inspect.isabstract(cls)
            ):
                for name in cls.names:
                    if name in found:
                        raise RuntimeError(
                            f"Backend '{name}' is declared twice: {found[name].__qualname__} and {cls.__qualname__}"
                        )
                    found[name] = cls
    return dict(sorted(found.items(), key=lambda item: item[1].order))


def backends() -> dict[str, type[Backend]]:
    """Every registered backend by name."""
    return dict(_registry())


def backend(name: str) -> type[Backend]:
    """The Backend class registered as `name`; ConfigError for a name no module declares."""
    try:
        return _registry()[name]
    except KeyError:
        raise ConfigError(f"Unknown backend '{name}'; choose one of {', '.join(_registry())}.") from None


def in_process_backends() -> tuple[str, ...]:
    """The backends whose engine runs here, in this process tree (not a server's)."""
    return tuple(name for name, cls in _registry().items() if cls.in_process)


def context_window(engine: EngineConfig) -> int | None:
    """Tokens of context the engine gives a request (see Backend.context_window)."""
    return backend(engine.backend).context_window(engine)


def availability(name: str) -> str | None:
    """None when backend `name` can run on this machine, else the reason it cannot, for the user."""
    return backend(name).availability(name)


def validate_engine_config(engine: EngineConfig, load: LoadConfig) -> list[str]:
    """Problems with the engine's settings, each a sentence for the user: each one's own bounds and choices
    (its declaration's), then, once those hold, the backend's rules (LMDeploy's, the server's), which may assume
    them (and would say a value out of its range again, in other words)."""
    problems = setting_problems(engine, Part.ENGINE, engine.backend) or backend(engine.backend).validate(engine, load)
    uvloop = uvloop_problem(load) if load.load_pattern == LoadPattern.ENGINE_API else None
    return problems + ([uvloop] if uvloop else [])


def backend_rules(name: str) -> BackendRules:
    """What the generic checks need to know of backend `name` (an unknown name: only that it is unknown)."""
    found = _registry().get(name)
    if found is None:
        return BackendRules(known=tuple(_registry()))
    return BackendRules(
        known=tuple(_registry()),
        needs_model=found.needs_model,
        load_patterns=found.load_patterns,
        takes_images=found.takes_images,
        in_process=found.in_process,
    )


def run_config_problems(config: RunConfig) -> list[str]:
    """Every problem of the run's settings, each a sentence for the user: the generic ones, and once those are
    fixed, the engine's (a backend's rules may assume sane generic settings)."""
    rules = backend_rules(config.engine.backend)
    problems = validate_run_config(config, rules, dataset_rules(config))
    return problems or (
        validate_engine_config(config.engine, config.load)
        + dataset(config.dataset.dataset_name).backend_problems(config.engine, rules)
    )


def engine_settings_key(engine: EngineConfig, load: LoadConfig) -> tuple:
    """Equal keys mean a loaded engine can be reused as it is."""
    return (engine.backend, *backend(engine.backend).settings_key(engine, load))


def tokenizer_from_engine(name: str) -> bool:
    """True when prompts are sampled with the loaded engine's tokenizer, so the engine loads first: a
    server may name its model (and so its tokenizer) only when asked, and loading it costs nothing."""
    return backend(name).tokenizer_from_engine


def load_engine(engine: EngineConfig, load: LoadConfig) -> Engine:
    """Load the model behind `engine.backend`; raises EngineUnavailable or ModelError with a clear message."""
    reason = availability(engine.backend)
    if reason:
        raise EngineUnavailable(reason)
    return backend(engine.backend).load(engine, load)


def check_run_config(config: RunConfig) -> None:
    """Raise one ConfigError carrying every problem, generic and backend-specific, or why the backend cannot run
    here."""
    problems = run_config_problems(config)
    if not problems:
        reason = availability(config.engine.backend)
        problems = [reason] if reason else []
    if problems:
        raise ConfigError(" ".join(problems))
