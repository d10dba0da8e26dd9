"""Datasets by name: the registry of `Dataset` classes, and the checks of a run's dataset settings that need them.

A dataset registers by being defined in a module of this package whose name ends in `_dataset`, or in a plugin: a
Python file in a folder the environment variable BENCH_STUDIO_PLUGINS names (bench_core/plugins.py). The registry
imports those modules the first time a dataset is asked for and indexes their `Dataset` classes by the names they declare, so a new dataset is offered by --dataset-name, the
sidebar and the checks with nothing else to edit. The environment is read at each ask: the dashboard's engine
process and the CLI see the plugins of the environment they were started in.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import pkgutil

from ..config import RunConfig, of_part, setting
from ..config.settings import Part, Setting
from ..config.validation import DatasetRules
from ..errors import ConfigError
from ..plugins import PLUGINS_ENV, plugin_modules
from ..states import LoadPattern
from .base import Dataset

DATASET_MODULE_SUFFIX = "_dataset"

__all__ = [
    "Dataset",
    "dataset",
    "dataset_names",
    "dataset_problems",
    "dataset_rules",
    "datasets_taking",
    "find_dataset",
    "output_length",
    "registered_datasets",
    "takes",
]


def registered_datasets() -> dict[str, Dataset]:
    """Every registered dataset by name, in the order they are listed (their `order`)."""
    return dict(_registry(os.environ.get(PLUGINS_ENV, "")))


def dataset_names() -> tuple[str, ...]:
    return tuple(registered_datasets())


def find_dataset(name: object) -> Dataset | None:
    """The dataset registered as `name`; None for any other value (a history row of a plugin not loaded here)."""
    return registered_datasets().get(name) if isinstance(name, str) else None


def dataset(name: str) -> Dataset:
    """The dataset registered as `name`; ConfigError for a name no module declares."""
    found = find_dataset(name)
    if found is None:
        raise ConfigError(_unknown(name))
    return found


def dataset_problems(config: RunConfig) -> list[str]:
    """What the datasets refuse in the run's settings, each a sentence: an unknown name; a setting of another
    dataset set; the dataset's own rules; a trace load pattern for a dataset without send times."""
    name, data = config.dataset.dataset_name, config.dataset
    chosen = find_dataset(name)
    if chosen is None:
        return [_unknown(name)]
    problems = [
        f"{declared.cli_flag} applies to the {_names(takers)} dataset{'s' if len(takers) > 1 else ''} only."
        for declared in of_part(Part.DATASET)
        if declared.per_dataset
        and not chosen.takes(declared)
        and not (data.quality_set and declared.name == "output_len")  # a quality set's prompts' length, any dataset
        and getattr(data, declared.name) != declared.default
        for takers in [datasets_taking(declared)]
    ]
    problems.extend(chosen.problems(config))
    if config.load.load_pattern == LoadPattern.TRACE and not chosen.timed:
        timed = [other.name for other in registered_datasets().values() if other.timed]
        problems.append(
            "The trace load pattern sends each request at its trace timestamp: choose the "
            + " or ".join(f"{other} dataset (--dataset-name {other})" for other in timed)
            + "."
        )
    return problems


def datasets_taking(declared: Setting) -> tuple[str, ...]:
    """The datasets that take `declared`, in their order (every one, for a setting of every dataset)."""
    return tuple(name for name, registered in registered_datasets().items() if registered.takes(declared))


def takes(name: object, declared: Setting) -> bool:
    """Whether a run of dataset `name` takes `declared`; an unknown name takes every dataset's settings only."""
    chosen = find_dataset(name)
    return chosen.takes(declared) if chosen is not None else not declared.per_dataset


def output_length(name: object) -> Setting | None:
    """The setting holding the output length a run of dataset `name` asks for; None where its records say their
    own (a trace) or the name is unknown here."""
    chosen = find_dataset(name)
    return setting(chosen.output_length) if chosen is not None and chosen.output_length else None


def dataset_rules(config: RunConfig) -> DatasetRules:
    """What the generic checks (config.validation) need of the run's dataset."""
    return DatasetRules(
        problems=tuple(dataset_problems(config)), takes=functools.partial(takes, config.dataset.dataset_name)
    )


def _unknown(name: object) -> str:
    return f"Unknown dataset name '{name}'; choose one of {', '.join(registered_datasets())}."


def _names(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@functools.cache
def _registry(plugins: str) -> dict[str, Dataset]:
    """The datasets of this package's modules and of the plugins (`plugins`: the variable's value, the cache's key)."""
    found: dict[str, Dataset] = {}
    modules = [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if info.name.endswith(DATASET_MODULE_SUFFIX)
    ]
    for module in [*modules, *plugin_modules()]:
        for cls in vars(module).values():
            if (
                isinstance(cls, type)
                and issubclass(cls, Dataset)
                and cls.__module__ == module.__name__
                and not inspect.isabstract(cls)
            ):
                if cls.name in found:
                    raise ConfigError(
                        f"Dataset '{cls.name}' is declared twice: {type(found[cls.name]).__qualname__} and "
                        f"{cls.__qualname__}"
                    )
                found[cls.name] = cls()
    return dict(sorted(found.items(), key=lambda item: item[1].order))
