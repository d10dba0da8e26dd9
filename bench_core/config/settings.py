"""A setting, declared once: what it is, where it applies, how it is bounded, spelled and shown.

Every setting of a run (the engine's knobs, the dataset, the load, generation, the SLO) is one `Setting` in
`catalog.py`. The rest reads it: the config dataclasses (`run_config`), validation, the CLI's flags, the sidebar's
widgets and their URL keys, the history's columns and titles, run_diff's "does not apply", and sweep parsing.
A setting's text form (a sweep value, a URL parameter, a CSV cell) goes through `parse_text`, `from_cell` and
`format_value`, with one boolean syntax.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")
NONE_WORDS = ("", "none")  # how an optional setting is left unset in text
# The largest whole number a setting or a dataset record's length takes where its declaration names no maximum:
# engines hold token counts and sizes in 32-bit integers, and a sum of such numbers over as many requests still
# fits a history column (a 64-bit integer), where 10**30 output tokens would fail the run's save.
MAX_WHOLE_NUMBER = 2**31 - 1


class Part(enum.StrEnum):
    """The part of a RunConfig a setting belongs to; engine settings reload the engine when they change."""

    ENGINE = "engine"
    DATASET = "dataset"
    LOAD = "load"
    GENERATION = "generation"
    SLO = "slo"
    SWEEP = "sweep"  # how a sweep runs its points and searches: not a part of a RunConfig, not in the history


def parse_bool(text: str) -> bool:
    """The one boolean syntax: true/1/yes/on and false/0/no/off, in any case; ValueError otherwise."""
    word = str(text).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(text)


def format_value(value: Any) -> str:
    """A value as text that `Setting.parse_text` reads back: "none", "true"/"false", 4 rather than 4.0."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def is_missing(value: Any) -> bool:
    """An empty cell: None, an empty string, or NaN (pandas' missing number)."""
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class Bounds:
    """The values a number may take: from `low` to `high`, each included unless open. The sentence when they are
    broken is made from them (`words`), so it always names the bound; `note` adds why, where the numbers alone do
    not say it (what 1 means, whose rule it is)."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def hold(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    @property
    def finite(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def words(self, whole: bool = False, scale: float = 1.0) -> str:
        """The range in words, for a number typed `scale` times smaller than stored (an SLO's ms):
        "a whole number from 1 to 1,000,000", "a number above 0 and at most 86,400", "a number above 0"."""
        low, high = number_text(self.low / scale), number_text(self.high / scale)
        kind = "a whole number" if whole else "a number"
        if not self.low_open and not self.high_open and self.finite:
            return f"{kind} from {low} to {high}"
        ends = [
            *([f"above {low}" if self.low_open else f"at least {low}"] if math.isfinite(self.low) else []),
            *([f"below {high}" if self.high_open else f"at most {high}"] if math.isfinite(self.high) else []),
        ]
        return f"{kind} {' and '.join(ends)}".strip()

    @property
    def widget_min(self) -> float | None:
        return None if self.low_open or math.isinf(self.low) else self.low

    @property
    def widget_max(self) -> float | None:
        return None if self.high_open or math.isinf(self.high) else self.high


def number_text(value: float) -> str:
    """A number as a message names it: whole ones with thousands separators (10**30 in full), others as %g."""
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer() and abs(value) < 1e16):
        return f"{int(value):,}"
    return f"{value:g}"


@dataclass(frozen=True)
class Widget:
    """How the sidebar draws a setting where the kind alone does not say: a slider or radio instead of the
    default widget, a number's step and format, the text of an empty input, and where it starts. A number input has
    no lowest or highest value: the browser would refuse one beyond them unseen (dashboard.sidebar)."""

    # "slider", "radio", "switch" (a checkbox that turns a count on at `start`, or off at 0, with the count beside
    # it); "" the kind's own (number input, checkbox, select box, text input)
    style: str = ""
    step: float | None = None
    format: str | None = None
    placeholder: str | None = None
    start: float | None = None  # the value the widget starts at, where the setting's default is not one to offer
    key: str = ""  # the widget's session and URL key when it is not the part's rule (see dashboard.sidebar)


@dataclass(frozen=True)
class Setting:
    """One setting of a run. `name` is its config field, history column, sweep name and the stem of its flag."""

    name: str
    part: Part
    kind: type  # bool, int, float or str
    default: Any
    label: str = ""  # for a column, an axis, a compare row; default: the name in words
    unit: str = ""
    help: str = ""  # a sentence for the sidebar and the knob flags
    group: str = ""  # the engine group (sidebar expander, CLI argument group) of an engine knob
    optional: bool = False  # None is a value: unset, automatic
    choices: tuple[Any, ...] | None = None
    choice_message: str = "{flag} must be one of {choices}; got '{value}'."  # may name {flag}, {choices}, {value}
    choice_help: Mapping[Any, str] = field(default_factory=dict, compare=False)  # a sentence per choice
    choice_labels: Mapping[Any, str] = field(default_factory=dict, compare=False)  # a choice's name where not its value
    # The choices a backend takes, where it takes fewer than `choices` (LMDeploy's dtypes lack float32).
    backend_choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict, compare=False)
    bounds: Bounds | None = None
    rule: str = ""  # the constraint in words, shown with the widget and the flag
    backends: tuple[str, ...] | None = None  # where it means something; None: everywhere
    load_patterns: tuple[str, ...] | None = None
    # A setting of some datasets only: those that name it in their `settings` (load/base.py::Dataset) take it.
    per_dataset: bool = False
    flags: tuple[str, ...] = ()  # its CLI flags, spelled as LMDeploy's scripts spell them; default --name-with-dashes
    cli_help: str = ""  # its flag's help, in the scripts' words; an engine knob's is made from `help`
    sweepable: bool = False
    allow_inf: bool = False  # inf is a value (a request rate of inf sends everything at once)
    text_parser: Callable[[str], Any] | None = None  # a text form beyond the kind's (quant_policy's names)
    secret: bool = False  # never recorded, compared or shown in a URL
    compared: bool = True  # a difference between runs (run_diff)
    # The output length of the datasets it applies to: the tokens each request asks for (one per dataset; run_diff
    # compares them as one "Output length", whichever dataset a run used).
    output_length: bool = False
    widget: Widget | None = field(default_factory=Widget)  # None: not drawn in the sidebar
    widget_label: str = ""  # the sidebar's label; default: the flag for an engine knob, else the label
    history_key: str = ""  # its flat key when not its name (the SLO's slo_ttft_s)
    typed_scale: float = 1.0  # a value typed in a widget or a flag, times this, is the value (ms typed, s stored)
    engine_fields: Mapping[str, str] = field(
        default_factory=dict, compare=False
    )  # backend -> the engine config's field for it

    # ---- names -----------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """Its flat key: the history column and config.json key."""
        return self.history_key or self.name

    @property
    def cli_flags(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.rstrip("_").replace("_", "-"),)

    @property
    def cli_flag(self) -> str:
        """Its long flag, as messages name it."""
        return next(flag for flag in self.cli_flags if flag.startswith("--"))

    @property
    def shown_label(self) -> str:
        """Its label; a setting declared without one by its name in words ("Async" for async_)."""
        return self.label or self.name.replace("_", " ").strip().capitalize()

    @property
    def title(self) -> str:
        """Its label with its unit, for an axis or a table row."""
        return f"{self.shown_label} ({self.unit})" if self.unit else self.shown_label

    @property
    def is_knob(self) -> bool:
        """An engine knob: a setting of some backends' engines, in one of their groups."""
        return self.part == Part.ENGINE and bool(self.group)

    @property
    def numeric(self) -> bool:
        """A number the user types (not one of a few choices): it has a finite range (`limits`)."""
        return self.kind in (int, float) and self.choices is None

    @property
    def limits(self) -> Bounds:
        """The range of a number setting: its bounds, a whole number's ends at -/+MAX_WHOLE_NUMBER where they name
        none (a float setting declares both ends: see __post_init__)."""
        bounds = self.bounds or Bounds()
        if self.kind is not int:
            return bounds
        return dataclasses.replace(
            bounds,
            low=bounds.low if math.isfinite(bounds.low) else -MAX_WHOLE_NUMBER,
            high=bounds.high if math.isfinite(bounds.high) else MAX_WHOLE_NUMBER,
        )

    def __post_init__(self) -> None:
        if self.numeric and not self.limits.finite:
            raise TypeError(f"The number setting {self.name} declares no finite range: give it bounds with both ends.")

    @property
    def field_type(self) -> Any:
        return self.kind | None if self.optional else self.kind

    # ---- where it applies ------------------------------------------------------------------------

    def applies(self, backend: str | None = None, load_pattern: str | None = None) -> bool:
        """Whether the setting means something for a run of these; an argument left None rules nothing out. Which
        datasets take it, the datasets say (load/base.py::Dataset.takes)."""
        return all(
            value is None or allowed is None or value in allowed
            for value, allowed in ((backend, self.backends), (load_pattern, self.load_patterns))
        )

    def not_applicable(self, backend: str) -> str:
        """Why this setting cannot be given for `backend`, naming the flag and the backends that use it."""
        names = list(self.backends or ())
        backends = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return (
            f"{self.cli_flag} applies to the {backends} backend{'s' if len(names) > 1 else ''} only, not to {backend}."
        )

    # ---- values ----------------------------------------------------------------------------------

    def choice_label(self, choice: Any) -> str:
        """A choice as a widget names it: its label, "off" for None, else the value itself."""
        return self.choice_labels.get(choice, "off" if choice is None else str(choice))

    def choices_for(self, backend: str | None) -> tuple[Any, ...] | None:
        """Its choices on `backend` (None: any backend's)."""
        return self.backend_choices.get(backend, self.choices) if backend is not None else self.choices

    def problems(self, value: Any, backend: str | None = None) -> list[str]:
        """The sentence its bounds or choices (on `backend`) give when `value` breaks them; empty when allowed."""
        if value is None and self.optional:
            return []
        allowed = self.choices_for(backend)
        if allowed is not None and value not in allowed:
            choices = ", ".join(format_value(choice) for choice in allowed if choice is not None)
            return [self.choice_message.format(flag=self.cli_flag, choices=choices, value=value)]
        if self.numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not self.limits.hold(value) and not (self.allow_inf and value == math.inf):
                return [self.out_of_range(value)]
        return []

    def out_of_range(self, value: float) -> str:
        """The sentence for a value outside its range: the flag, the range in the unit typed, the value."""
        limits = self.limits
        shown = value / self.typed_scale if self.typed_scale != 1 else value
        words = limits.words(whole=self.kind is int, scale=self.typed_scale)
        inf = ", or inf" if self.allow_inf else ""
        note = f" {limits.note}" if limits.note else ""
        return f"{self.cli_flag} must be {words}{inf}; got {number_text(shown)}.{note}"

    def rule_for(self, backend: str) -> str:
        """The parts of `rule` that hold on `backend`: a part headed by backends' names ("TurboMind: a multiple of
        32", "turbomind and pytorch: ...") is left out on any other backend; a part headed by none always holds."""
        known = {name.lower() for name in self.backends or ()}
        kept = []
        for part in self.rule.split("; ") if self.rule else ():
            head, colon, _ = part.partition(": ")
            named = {name.strip().lower() for name in head.replace(" and ", ",").split(",")} if colon else set()
            if named and named <= known and backend.lower() not in named:
                continue
            kept.append(part)
        return "; ".join(kept)

    @property
    def text_rule(self) -> str:
        """What its text form takes, for a message: "a whole number from 1 to 1,000,000", "true or false"..."""
        if self.numeric:
            wanted = self.limits.words(whole=self.kind is int) + (", or inf" if self.allow_inf else "")
        else:
            wanted = {bool: "true or false", int: "a whole number", float: "a number"}.get(self.kind, "a value")
        return wanted + (" or none" if self.optional else "")

    def parse_text(self, text: str) -> Any:
        """The value `text` spells for this setting (a sweep value, a URL parameter); ValueError if none."""
        text = text.strip()
        if self.optional and text.lower() in NONE_WORDS:
            return None
        if self.text_parser is not None:
            value = self.text_parser(text)
        elif self.kind is bool:
            value = parse_bool(text)
        elif self.kind is int:
            value = int(text)
        elif self.kind is float:
            value = float(text)
            if math.isnan(value) or (math.isinf(value) and not self.allow_inf):
                raise ValueError(text)
        else:
            value = text
        return value

    def from_cell(self, value: Any) -> Any:
        """A value read back from a CSV cell or JSON, as this setting's kind; its default when empty or unreadable
        (a hand-edited cell)."""
        if is_missing(value):
            return self.default
        if isinstance(value, self.kind) and not (self.kind is int and isinstance(value, bool)):
            return value
        try:
            if self.kind is bool:
                return parse_bool(str(value))
            if self.kind is int:
                return int(float(value))
            if self.kind is float:
                return float(value)
            return str(value)
        except ValueError:
            return self.default


def by_name(settings: tuple[Setting, ...]) -> dict[str, Setting]:
    return {setting.name: setting for setting in settings}


def part_settings(settings: tuple[Setting, ...], part: Part) -> tuple[Setting, ...]:
    return tuple(setting for setting in settings if setting.part == part)


def widget_label(setting: Setting) -> str:
    """The sidebar's label: a knob by its flag, as LMDeploy's users know it; else its label."""
    if setting.widget_label:
        return setting.widget_label
    return setting.cli_flag if setting.is_knob else setting.title


def unknown(name: str, choices: Mapping[str, Any] | tuple[str, ...]) -> str:
    return f"Unknown setting '{name}'; known: {', '.join(choices)}."
