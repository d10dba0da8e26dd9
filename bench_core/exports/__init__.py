"""Exports by kind: the files a run, a comparison or a sweep can be downloaded as, and the registry of them.

An export is one `Export` declared at the top of a module of this package whose name ends in `_export`, or of a
module in a folder $BENCH_STUDIO_PLUGINS names (bench_core/plugins.py). It says what it covers (the scopes it
has a builder for), its MIME type, its file name and how its bytes are built from what the page or the command
has (a `RunSubject`, `ComparisonSubject` or `SweepSubject`). The CLI's `--export KIND[:PATH]` and every page's
download buttons come from this registry, so a new export is one module and nothing else to edit.
"""

from __future__ import annotations

import enum
import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ConfigError
from ..plugins import plugin_modules

if TYPE_CHECKING:  # the CLI imports the registry to list the kinds in --help: no pandas, no history before a run
    import pandas as pd

    from ..config import SLO
    from ..store.history import History
    from ..store.run_parts import RunParts
    from ..sweep.plan import SweepPlan

EXPORT_MODULE_SUFFIX = "_export"
KIND_PATTERN = r"[a-z0-9][a-z0-9-]*"


class Scope(enum.StrEnum):
    """What an export is of: one run, the runs compared on the History page, a sweep, a tuning study."""

    RUN = "run"
    COMPARISON = "comparison"
    SWEEP = "sweep"
    TUNE = "tune"  # no subject yet: the tuning study (branch tune) brings its own, and its page draws the buttons


@dataclass(frozen=True)
class RunSubject:
    """One ended run as the Run page or a run command has it."""

    scope: ClassVar[Scope] = Scope.RUN
    history: History
    run_id: str
    requests: pd.DataFrame | None  # None when the run failed before measuring
    lmdeploy_row: Mapping[str, Any]  # its row of LMDeploy's CSV, names and formats as save_csv writes them
    parts: Callable[[], RunParts]  # read when an export needs them: the run's folder, its telemetry

    @property
    def run_ids(self) -> list[str]:
        return [self.run_id]

    @property
    def stem(self) -> str:
        return f"run-{self.run_id}"


@dataclass(frozen=True)
class ComparisonSubject:
    """Runs compared side by side: their history rows, their request tables by run name (tables.run_names) and
    the names of those without one."""

    scope: ClassVar[Scope] = Scope.COMPARISON
    history: History
    rows: pd.DataFrame
    request_tables: Mapping[str, pd.DataFrame]
    missing: Sequence[str]
    baseline: str | None = None  # the run id the others are judged against; None: the oldest run

    @property
    def run_ids(self) -> list[str]:
        return list(self.rows["run_id"].astype(str))

    @property
    def stem(self) -> str:
        return f"compare-{'-'.join(self.run_ids)[:120]}"


@dataclass(frozen=True)
class SweepSubject:
    """A sweep: its plan, the history's rows (`history_runs`) and its finished runs as the Sweep page shows them
    (sweep.results.sweep_runs), with the SLO and goodput targets the page set."""

    scope: ClassVar[Scope] = Scope.SWEEP
    history: History
    plan: SweepPlan
    history_runs: pd.DataFrame
    runs: pd.DataFrame
    status: str = ""
    slo: SLO | None = None
    targets: Mapping[str, float | None] = field(default_factory=dict)
    rerun: str = ""  # a tune's: the command that runs its best point again

    @property
    def run_ids(self) -> list[str]:
        return list(self.runs["run_id"].astype(str))

    @property
    def stem(self) -> str:
        return f"sweep-{self.plan.sweep_id}"


Subject = RunSubject | ComparisonSubject | SweepSubject


@dataclass(frozen=True)
class Export:
    """One file a scope can be exported as. `builds` maps each scope it covers to the pure function that makes
    its bytes; `file_name` is a pattern over the subject's `stem` (`{stem}-requests.csv`)."""

    kind: str  # what `--export` takes: lower case, no colon
    label: str  # the download button's text; `{scope}` in it becomes the scope's name ("Report of this {scope}")
    mime: str
    file_name: str
    builds: Mapping[Scope, Callable[[Any], bytes]]
    help: str = ""  # the button's tooltip, and the CLI's line about it
    order: int = 100  # buttons left to right, and the CLI's list, by this and then by kind
    # Whether a page offers it for this subject (a file that would be empty is not offered); None: always.
    offered: Callable[[Any], bool] | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(KIND_PATTERN, self.kind):  # `--export KIND:PATH` splits at the first colon
            raise ValueError(f"an export's kind is lower case letters, digits and hyphens, not '{self.kind}'")

    @property
    def scopes(self) -> tuple[Scope, ...]:
        return tuple(scope for scope in Scope if scope in self.builds)

    def offers(self, subject: Subject) -> bool:
        return self.offered is None or self.offered(subject)

    def label_for(self, subject: Subject) -> str:
        return self.label.format(scope=subject.scope)

    def name_for(self, subject: Subject) -> str:
        return self.file_name.format(stem=subject.stem)

    def build(self, subject: Subject) -> bytes:
        """The file's bytes for `subject`; ConfigError for a scope it does not cover."""
        try:
            build = self.builds[subject.scope]
        except KeyError:
            raise ConfigError(
                f"The {self.kind} export is of {_listed(self.scopes)}, not of a {subject.scope}."
            ) from None
        return build(subject)


def _listed(scopes: Iterable[Scope]) -> str:
    return " or ".join(f"a {scope}" for scope in scopes)


def _declared(module: ModuleType) -> list[Export]:
    return [value for value in vars(module).values() if isinstance(value, Export)]


@functools.cache
def _builtin() -> tuple[Export, ...]:
    found: list[Export] = []
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.endswith(EXPORT_MODULE_SUFFIX):
            found += _declared(importlib.import_module(f"{__name__}.{module_info.name}"))
    return tuple(found)


def exports(scope: Scope | None = None) -> dict[str, Export]:
    """Every registered export by kind (this package's, then the plugins'), in their order; with `scope`, only
    those that cover it."""
    found: dict[str, Export] = {}
    for export in [*_builtin(), *(export for module in plugin_modules() for export in _declared(module))]:
        if export.kind in found and found[export.kind] is not export:
            raise ConfigError(f"Two exports are named '{export.kind}': give one of them another kind.")
        found[export.kind] = export
    ordered = sorted(found.values(), key=lambda export: (export.order, export.kind))
    return {export.kind: export for export in ordered if scope is None or scope in export.builds}


def export(kind: str) -> Export:
    """The export registered as `kind`; ConfigError naming the others for a kind no module declares."""
    try:
        return exports()[kind]
    except KeyError:
        raise ConfigError(f"Unknown export '{kind}'; choose one of {', '.join(exports())}.") from None


def describe_kinds() -> str:
    """Each kind with the scopes it covers, for the CLI's help: `report (run, comparison, sweep), ...`."""
    return ", ".join(f"{kind} ({', '.join(export.scopes)})" for kind, export in exports().items())
