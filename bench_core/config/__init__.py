"""Settings and the run they describe: the settings catalog (one declaration per setting), the RunConfig built
from it, and the checks a run passes before any work. Imports no engine and no streamlit."""

from .catalog import (
    DATASET_NAMES, KNOBS, LOAD_PATTERNS, MAX_SEED, SETTINGS, SWEEPABLE, engine_config_fields, knobs_for,
    of_part, parse_quant_policy, setting,
)
from .run_config import (
    DEFAULT_PERCENTILES, SLO, DatasetConfig, EngineConfig, GenerationSettings, LoadConfig, RunConfig,
    applied_engine_settings, config_from_values, settings_of,
)
from .settings import Part, Setting, format_value, parse_bool
from .validation import (
    BackendRules, applies_under, check_values, generation_problems, ignored_load_settings, pattern_label,
    sampling_problems, validate_run_config,
)

__all__ = [
    "DATASET_NAMES", "DEFAULT_PERCENTILES", "KNOBS", "LOAD_PATTERNS", "MAX_SEED", "SETTINGS", "SLO", "SWEEPABLE",
    "BackendRules", "DatasetConfig", "EngineConfig", "GenerationSettings", "LoadConfig", "Part", "RunConfig",
    "Setting", "applied_engine_settings", "applies_under", "check_values", "config_from_values",
    "engine_config_fields", "format_value", "generation_problems", "ignored_load_settings", "knobs_for", "of_part",
    "parse_bool", "parse_quant_policy", "pattern_label", "sampling_problems", "setting", "settings_of",
    "validate_run_config",
]
