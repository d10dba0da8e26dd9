"""What a benchmark run is asked to do: one `RunConfig` of five parts, built from the settings catalog.

Each part (EngineConfig, DatasetConfig, LoadConfig, GenerationSettings, SLO) is a dataclass whose fields are the
catalog's settings of that part, in its order, with its defaults: a setting declared there is a field here. One
`RunConfig` travels from the sidebar or the CLI flags to the runner and into the history as one flat dict
(`to_flat_dict`, keys = history columns; `from_flat_dict` reads it back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .catalog import of_part, setting
from .settings import Part

DEFAULT_PERCENTILES = (50, 75, 95, 99)


def _part_class(part: Part, name: str, doc: str) -> type:
    fields = [(s.name, s.field_type, field(default=s.default, repr=not s.secret)) for s in of_part(part)]
    cls = dataclasses.make_dataclass(name, fields)
    cls.__module__, cls.__doc__ = __name__, doc  # found by pickle here, as a class written in this module is
    return cls


if TYPE_CHECKING:

    class _CatalogPartClass(type):
        def __getattr__(cls, name: str) -> Any: ...  # a field's default, read from the class

    class _CatalogPart(metaclass=_CatalogPartClass):
        """A part as a type checker sees it: its fields are the catalog's settings, made into a dataclass at import
        below, so it cannot know them; they read as Any."""

        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

        def __init__(self, **values: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    class EngineConfig(_CatalogPart): ...

    class DatasetConfig(_CatalogPart): ...

    class LoadConfig(_CatalogPart): ...

    class GenerationSettings(_CatalogPart): ...

    class SLO(_CatalogPart): ...
else:
    EngineConfig = _part_class(
        Part.ENGINE,
        "EngineConfig",
        "Everything that needs the engine to be (re)loaded "
        "when it changes. The API key lives only in memory: it never reaches config.json or "
        "the history.",
    )
    DatasetConfig = _part_class(Part.DATASET, "DatasetConfig", "Which prompts to send, sampled with LMDeploy's rules.")
    LoadConfig = _part_class(
        Part.LOAD,
        "LoadConfig",
        'How requests are offered to the engine (see README, "What is measured": timing semantics).',
    )
    GenerationSettings = _part_class(
        Part.GENERATION,
        "GenerationSettings",
        "Sampling settings. LMDeploy's pipeline script forces greedy decoding whatever these say.",
    )
    SLO = _part_class(
        Part.SLO,
        "SLO",
        "Optional service-level thresholds in seconds; a request is good when it meets all that are set.",
    )
_PART_CLASSES: dict[Part, type[Any]] = {
    Part.ENGINE: EngineConfig,
    Part.DATASET: DatasetConfig,
    Part.LOAD: LoadConfig,
    Part.GENERATION: GenerationSettings,
    Part.SLO: SLO,
}


def client_in_workers(client_processes: int) -> bool:
    """Whether a run's HTTP client sends from worker processes (engines/client_workers.py) rather than from the
    engine's own process: more client processes than the one the setting defaults to."""
    return client_processes > setting("client_processes").default


@dataclass
class RunConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    slo: SLO = field(default_factory=SLO)
    label: str = ""
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES

    def part(self, part: Part) -> Any:
        return getattr(self, part.value)

    def value(self, name: str) -> Any:
        """The value of the catalog's setting `name`."""
        return getattr(self.part(setting(name).part), name)

    def to_flat_dict(self) -> dict[str, Any]:
        """One level of keys, as history columns and config.json use them. An engine knob that does not apply to
        the backend is None (left empty), so a CPU run's row does not claim device=cuda or a KV cache fraction it
        never used; a secret is left out."""
        flat: dict[str, Any] = {}
        for part in _PART_CLASSES:
            values = self.part(part)
            for declared in of_part(part):
                if not declared.secret:
                    applies = not declared.is_knob or declared.applies(backend=self.engine.backend)
                    flat[declared.key] = getattr(values, declared.name) if applies else None
        flat["label"] = self.label
        flat["percentiles"] = ",".join(_format_number(p) for p in self.percentiles)
        return flat

    @classmethod
    def from_flat_dict(cls, flat: dict[str, Any]) -> RunConfig:
        """Inverse of `to_flat_dict`; unknown keys are ignored, missing ones take defaults, and so do knobs
        that do not apply to the backend (older rows recorded LMDeploy's defaults for every backend)."""
        backend = str(flat.get("backend") or "")

        def part(part: Part) -> Any:
            return _PART_CLASSES[part](
                **{
                    setting.name: setting.from_cell(flat[setting.key])
                    for setting in of_part(part)
                    if setting.key in flat
                    and not (setting.is_knob and backend and not setting.applies(backend=backend))
                }
            )

        percentiles = flat.get("percentiles") or DEFAULT_PERCENTILES
        if isinstance(percentiles, str):
            percentiles = tuple(float(p) for p in percentiles.split(",") if p.strip())
        return cls(
            engine=part(Part.ENGINE),
            dataset=part(Part.DATASET),
            load=part(Part.LOAD),
            generation=part(Part.GENERATION),
            slo=part(Part.SLO),
            label=str(flat.get("label") or ""),
            percentiles=tuple(percentiles),
        )


def config_from_values(
    values: Mapping[str, Any], label: str = "", percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
) -> RunConfig:
    """The RunConfig of these settings' values (by name; the others take their defaults)."""
    parts = {
        part: cls(**{s.name: values[s.name] for s in of_part(part) if s.name in values})
        for part, cls in _PART_CLASSES.items()
    }
    return RunConfig(
        engine=parts[Part.ENGINE],
        dataset=parts[Part.DATASET],
        load=parts[Part.LOAD],
        generation=parts[Part.GENERATION],
        slo=parts[Part.SLO],
        label=label,
        percentiles=percentiles,
    )


def settings_of(config: RunConfig) -> dict[str, Any]:
    """Every setting's value in `config`, by name: the inverse of `config_from_values`."""
    return {s.name: getattr(config.part(part), s.name) for part in _PART_CLASSES for s in of_part(part)}


def _format_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def applied_engine_settings(engine: EngineConfig) -> dict[str, Any]:
    """The engine's settings as recorded (config.json's nested form): a knob that does not apply to its backend is
    None, and a secret is left out."""
    return {
        setting.name: getattr(engine, setting.name) if setting.applies(backend=engine.backend) else None
        for setting in of_part(Part.ENGINE)
        if not setting.secret
    }
