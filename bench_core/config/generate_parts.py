"""Writes `parts.py`, the five config parts as dataclasses, from the settings catalog.

The parts are written out rather than made at import so that a type checker sees each setting's field and type
(`config.load.concurency` is an error, not Any). `tests/test_config_parts.py` fails when the file and the catalog
disagree; after changing a setting, run `python -m bench_core.config.generate_parts`.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterable
from pathlib import Path

from .catalog import SETTINGS
from .settings import Part, Setting

PARTS_FILE = Path(__file__).with_name("parts.py")
COMMAND = "python -m bench_core.config.generate_parts"

# Each part's class and what it holds; its fields are the catalog's settings of that part, in the catalog's order.
PART_CLASSES: dict[Part, tuple[str, str]] = {
    Part.ENGINE: (
        "EngineConfig",
        "Everything that needs the engine to be (re)loaded when it changes. The API key lives only in memory: it "
        "never reaches config.json or the history.",
    ),
    Part.DATASET: ("DatasetConfig", "Which prompts to send, sampled with LMDeploy's rules."),
    Part.LOAD: (
        "LoadConfig",
        'How requests are offered to the engine (see README, "What is measured": timing semantics).',
    ),
    Part.GENERATION: (
        "GenerationSettings",
        "Sampling settings. LMDeploy's pipeline script forces greedy decoding whatever these say.",
    ),
    Part.SLO: (
        "SLO",
        "Optional service-level thresholds in seconds; a request is good when it meets all that are set.",
    ),
}


def _literal(value: object) -> str:
    """The default as `ruff format` writes it: a string in double quotes, infinity by name."""
    if isinstance(value, float) and math.isinf(value):
        return "math.inf" if value > 0 else "-math.inf"
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def _field_line(setting: Setting) -> str:
    kind = setting.kind.__name__ + (" | None" if setting.optional else "")
    default = _literal(setting.default)
    if setting.secret:  # kept out of a config's repr, as out of the history
        default = f"field(default={default}, repr=False)"
    return f"    {setting.name}: {kind} = {default}"


def _class_text(name: str, doc: str, settings: Iterable[Setting]) -> str:
    wrapped = textwrap.wrap(doc, width=113)
    docstring = f'    """{wrapped[0]}"""' if len(wrapped) == 1 else '    """' + "\n    ".join(wrapped) + '\n    """'
    lines = [_field_line(setting) for setting in settings]
    return "\n".join(["@dataclass", f"class {name}:", docstring, "", *lines])


def render(settings: tuple[Setting, ...] = SETTINGS) -> str:
    """The text of parts.py for these settings."""
    classes = [
        _class_text(name, doc, (setting for setting in settings if setting.part == part))
        for part, (name, doc) in PART_CLASSES.items()
    ]
    uses_inf = any("math.inf" in _literal(setting.default) for setting in settings)
    uses_secret = any(setting.secret for setting in settings)
    imports = [
        *(["import math"] if uses_inf else []),
        "from dataclasses import dataclass" + (", field" if uses_secret else ""),
    ]
    return (
        f"# Generated from bench_core/config/catalog.py by `{COMMAND}`. Do not edit:\n"
        "# change the catalog and run it again (tests/test_config_parts.py fails while they disagree).\n"
        '"""The parts of a RunConfig, one field per setting of the catalog (see run_config.py)."""\n\n'
        + "\n".join([*imports, "", "", ""])
        + "\n\n\n".join(classes)
        + "\n"
    )


def main() -> None:
    PARTS_FILE.write_text(render(), encoding="utf-8")
    print(f"wrote {PARTS_FILE}")


if __name__ == "__main__":
    main()
