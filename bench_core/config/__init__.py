"""Settings and the run they describe: the settings catalog (one declaration per setting), the RunConfig built
from it, and the checks a run passes before any work. Imports no engine and no streamlit."""

from .catalog import (
    DATASET_NAMES, KNOBS, LMDEPLOY, LOAD_PATTERNS, MAX_SEED, SETTINGS, SWEEPABLE, engine_config_fields, knobs_for,
    of_part, parse_quant_policy, setting,
)
from .run_config import (
    DEFAULT_PERCENTILES, SLO, DatasetConfig, EngineConfig, GenerationSettings, LoadConfig, RunConfig,
    applied_engine_settings, config_from_values, settings_of,
)
from .settings import Part, Setting, format_value, parse_bool
from .validation import BackendRules, check_values, generation_problems, sampling_problems, validate_run_config

# Until the engines registry answers for them (its backends' own facts).
LMDEPLOY_BACKENDS = LMDEPLOY
IN_PROCESS_BACKENDS = ("turbomind", "pytorch", "transformers")
SERVER_BACKEND = "openai"  # any OpenAI-compatible HTTP server
BACKENDS = (*IN_PROCESS_BACKENDS, SERVER_BACKEND)

__all__ = [
    "BACKENDS", "DATASET_NAMES", "DEFAULT_PERCENTILES", "IN_PROCESS_BACKENDS", "KNOBS", "LMDEPLOY_BACKENDS",
    "LOAD_PATTERNS", "MAX_SEED", "SERVER_BACKEND", "SETTINGS", "SLO", "SWEEPABLE", "BackendRules", "check_values", "DatasetConfig",
    "EngineConfig", "GenerationSettings", "LoadConfig", "Part", "RunConfig", "Setting", "applied_engine_settings", "config_from_values", "settings_of",
    "engine_config_fields", "format_value", "generation_problems", "knobs_for", "of_part", "parse_bool",
    "parse_quant_policy", "sampling_problems", "setting", "validate_run_config",
]
