"""What a benchmark run is asked to do: one `RunConfig` of five parts, built from the settings catalog.

Each part (EngineConfig, DatasetConfig, LoadConfig, GenerationSettings, SLO) is a dataclass whose fields are the
catalog's settings of that part, in its order, with its defaults: a setting declared there is a field in parts.py,
which `python -m bench_core.config.generate_parts` writes from the catalog. One `RunConfig` travels from the
sidebar or the CLI flags to the runner and into the history as one flat dict (`to_flat_dict`, keys = history
columns; `from_flat_dict` reads it back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .catalog import of_part, setting
from .parts import SLO, DatasetConfig, EngineConfig, GenerationSettings, LoadConfig
from .settings import Part

DEFAULT_PERCENTILES = (50, 75, 95, 99)

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
