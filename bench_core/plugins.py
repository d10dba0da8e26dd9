"""Extension modules kept outside the package: the folders named in $BENCH_STUDIO_PLUGINS (separated as PATH is).

Every `*.py` file in those folders is imported once, under a name of its own, and each registry (exports,
and any other that asks) then looks through the modules for its own declarations, as it looks through its
package's modules. A module that cannot be imported is one error naming its file, never a traceback.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from .errors import ConfigError

PLUGINS_ENV = "BENCH_STUDIO_PLUGINS"


def plugin_modules() -> tuple[ModuleType, ...]:
    """The modules of the folders $BENCH_STUDIO_PLUGINS names, in its order and then by file name."""
    folders = tuple(folder for folder in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if folder)
    return _modules_of(folders)


@functools.cache
def _modules_of(folders: tuple[str, ...]) -> tuple[ModuleType, ...]:
    return tuple(_import(path) for folder in folders for path in sorted(Path(folder).glob("*.py")))


@functools.cache
def _import(path: Path) -> ModuleType:
    """The module in `path`; cached by path, so a folder named twice, or again later, is imported once."""
    name = f"bench_studio_plugin_{abs(hash(str(path.resolve()))):x}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{PLUGINS_ENV}: {path} is not a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # anything a module outside the package raises is one line naming it
        del sys.modules[name]
        raise ConfigError(f"{PLUGINS_ENV}: {path} could not be imported: {type(exc).__name__}: {exc}") from exc
    return module
