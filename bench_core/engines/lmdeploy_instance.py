"""LMDeploy's `turbomind` and `pytorch` engines built and driven as benchmark/profile_throughput.py does: the
engine_api load pattern.

The engine is built directly, `TurboMind.from_pretrained` or the PyTorch `Engine.from_pretrained` (with the
speculative config), so there is no backend auto-selection and no silent fallback: an engine that cannot load the
model fails the run. Prompts are encoded and outputs detokenized with LMDeploy's own `Tokenizer`, as their script
does; the drive (engine_api.py) creates one instance per worker and streams each request through
`async_stream_infer`, whose outputs are LMDeploy's `EngineOutput`s (new ids, a `ResponseType`, and with
enable_metrics the speculative accounting in `req_metrics.spec_info`). LMDeploy 0.18 keeps these names.

Nothing here imports lmdeploy at module level.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from ..config import EngineConfig, GenerationSettings, LoadConfig
from ..errors import ConfigError, ModelError
from ..load.datasets import SampledRequest
from ..models.resolve import last_line
from .base import Engine, EngineEvent, EngineInfo
from .engine_api import DONE, EngineAPIDrive, InstanceAPI
from .lmdeploy_configs import build_engine_api_generation_config, build_engine_config, build_speculative_config
from .lmdeploy_pipeline import engine_info, local_model_path


def build_instance_engine(engine: EngineConfig, load: LoadConfig) -> LMDeployInstanceEngine:
    """Build the engine as profile_throughput.py's `Engine` does; ConfigError or ModelError with one sentence."""
    from lmdeploy.tokenizer import Tokenizer

    model_path = local_model_path(engine.model)
    try:
        config = build_engine_config(engine, load)
    except (AssertionError, ValueError) as exc:
        raise ConfigError(f"LMDeploy rejects these engine settings: {last_line(exc)}.") from exc
    try:
        tokenizer = Tokenizer(model_path)
        if engine.backend == "turbomind":
            from lmdeploy.turbomind import TurboMind

            built = TurboMind.from_pretrained(
                model_path, engine_config=config, trust_remote_code=engine.trust_remote_code
            )
        else:
            from lmdeploy.pytorch.engine import Engine as PytorchEngine

            built = PytorchEngine.from_pretrained(
                model_path,
                engine_config=config,
                speculative_config=build_speculative_config(engine),
                trust_remote_code=engine.trust_remote_code,
            )
    except Exception as exc:
        raise ModelError(
            f"LMDeploy could not build its {engine.backend} engine for '{engine.model}': "
            f"{type(exc).__name__}: {last_line(exc)}"
        ) from exc
    info = engine_info(engine, model_path, getattr(built, "engine_config", config), None)
    info.notes.append("engine API: create_instance() / async_stream_infer, as profile_throughput.py")
    return LMDeployInstanceEngine(built, tokenizer, info)


def lmdeploy_outcome(output) -> tuple[str, str] | None:
    """How an EngineOutput ends its stream: FINISH is the engine's own end, CANCEL an abort, any other status but
    SUCCESS (more to come) an error named by its status."""
    from lmdeploy.messages import ResponseType

    if output.status == ResponseType.SUCCESS:
        return None
    if output.status == ResponseType.FINISH:
        return DONE, ""
    if output.status == ResponseType.CANCEL:
        return "abort", "LMDeploy cancelled the request"
    return "error", f"LMDeploy answered {output.status.name}"


class LMDeployInstanceEngine(Engine):
    """A TurboMind or PyTorch engine driven through its instance API. Takes any object with `create_instance()`
    whose instances offer `async_stream_infer`, and LMDeploy's Tokenizer (or one with its calls), so the request
    construction can be exercised without a GPU."""

    def __init__(self, built, tokenizer, info: EngineInfo):
        self._built = built
        self._tokenizer = tokenizer
        self.info = info

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer inside LMDeploy's, which their script samples prompts with."""
        return self._tokenizer.model.model

    def encode(self, prompt: str) -> list[int]:
        """As their script pre-encodes with --skip-tokenize."""
        return list(self._tokenizer.encode(prompt))

    def stream(
        self,
        requests: Sequence[SampledRequest],
        generation: GenerationSettings,
        load: LoadConfig,
        cancel: threading.Event,
    ) -> Iterator[EngineEvent]:
        api = InstanceAPI(
            engine=self._built,
            encode=lambda prompt: list(self._tokenizer(prompt).input_ids),  # their script, inside the measurement
            detokenizer=self._detokenizer,
            gen_config=lambda request: build_engine_api_generation_config(request, generation),
            outcome=lmdeploy_outcome,
            name="LMDeploy",
        )
        return EngineAPIDrive(api, requests, load).events(cancel)

    def _detokenizer(self, prompt_ids: list[int]):
        """Their script's incremental detokenizing: LMDeploy's DetokenizeState over the prompt and what came since."""
        from lmdeploy.tokenizer import DetokenizeState

        ids, state = list(prompt_ids), DetokenizeState(len(prompt_ids))

        def add(new_ids: Sequence[int]) -> str:
            nonlocal state
            ids.extend(new_ids)
            text, state = self._tokenizer.detokenize_incrementally(ids, state)
            return text

        return add

    def close(self) -> None:
        close = getattr(self._built, "close", None)
        if close is not None:
            close()
