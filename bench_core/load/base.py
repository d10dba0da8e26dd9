"""What a dataset is: the `Dataset` contract a dataset module declares, and the registry (load/__init__.py) reads.

A dataset answers for itself: its name, the catalog's settings it takes (declared there once, with
`per_dataset=True`, and named here), the one of them that sets the tokens each request asks for, how it samples its
requests, and what it refuses in a run's settings, each a sentence for the user. Everything that asked of a
dataset's name asks the dataset instead, so a new dataset is one module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ..config import DatasetConfig, EngineConfig, LoadConfig, RunConfig
from ..config.settings import Setting
from ..config.validation import BackendRules
from ..states import LoadPattern
from .requests import Sample
from .sources import source_problem


class Dataset(ABC):
    """One dataset: a subclass in a dataset module, registered by the `name` it declares."""

    name: ClassVar[str]
    order: ClassVar[int] = 100  # where it is listed (the CLI's choices, the sidebar): LMDeploy's first
    # The catalog's per-dataset settings it takes (the sidebar shows them for it; another dataset's are refused).
    settings: ClassVar[tuple[str, ...]] = ()
    # The one of `settings` that sets the tokens each request asks for; None where its records say their own.
    output_length: ClassVar[str | None] = None
    lmdeploy: ClassVar[bool] = False  # one of LMDeploy's scripts' datasets (the others show what a cache does)
    # What the user's own file holds, where the dataset reads one rather than ShareGPT conversations.
    own_file: ClassVar[str] = ""
    reads_source: ClassVar[bool] = True  # it reads its text from the run's dataset source (a file or a built-in)
    counts_sessions: ClassVar[bool] = False  # --num-prompts counts sessions of `turns` requests each
    waits: ClassVar[bool] = False  # a request may wait for another's answer or a time: the engine API load cannot
    timed: ClassVar[bool] = False  # its requests carry send times (send_at_s), which the trace load pattern keeps

    @abstractmethod
    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        """The run's requests, from its source and its settings; DatasetError with a sentence for a bad source."""

    def takes(self, declared: Setting) -> bool:
        """Whether `declared` means something for a run of this dataset: every dataset's, or one of its own."""
        return not declared.per_dataset or declared.name in self.settings

    def problems(self, config: RunConfig) -> list[str]:
        """What it refuses in the run's settings, each a sentence: its own rules (a subclass adds to these), a
        built-in source where it reads the user's file, a source that is not there (a quality set's prompts replace
        it), a load pattern that cannot wait for what it waits for."""
        data, problems = config.dataset, []
        if self.own_file and str(data.dataset).startswith("builtin:"):
            problems.append(
                f"The {self.name} dataset reads your own file ({self.own_file}): pass its path as the "
                f"dataset, not {data.dataset}."
            )
        elif self.reads_source and not data.quality_set and (missing := source_problem(str(data.dataset))):
            problems.append(missing)
        if self.waits and config.load.load_pattern == LoadPattern.ENGINE_API:
            problems.append(
                "The engine API load pattern (throughput) sends a request whenever a worker is free, as "
                "profile_throughput.py does, so it cannot wait for a turn's answer or a trace's timestamps: "
                f"run the {self.name} dataset with pipeline or restful."
            )
        return problems

    def backend_problems(self, engine: EngineConfig, backend: BackendRules) -> list[str]:
        """What it refuses of the run's backend or endpoint, each a sentence (images where it takes none)."""
        return []

    def output_file_tag(self, data: Any) -> str:
        """What profile_restful_api.py's default output file name says of this dataset (`data`: its settings)."""
        return self.name

    def lengths_note(self, data: DatasetConfig) -> str:
        """Why a preview's input lengths are not yet those sent, "" where they are."""
        return ""

    def hidden_reuse_note(self, data: DatasetConfig, load: LoadConfig, caching: bool) -> str:
        """Why prefix caching's effect can hardly show in this run, "" where nothing hides it."""
        return ""
