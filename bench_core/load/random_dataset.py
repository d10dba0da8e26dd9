"""`--dataset-name random`: LMDeploy's, lengths drawn at random (load/lengths.py), the dataset's text cut or repeated
to them, sampled as load/datasets.py::sample_random_requests does."""

from __future__ import annotations

from typing import Any

from ..config import DatasetConfig, RunConfig
from ..errors import DatasetError
from .base import Dataset
from .datasets import sample_conversations, sample_random_requests
from .lengths import RANDOM_LENGTHS, missing_lengths
from .requests import Sample


class Random(Dataset):
    name = "random"
    order = 1
    settings = RANDOM_LENGTHS
    output_length = "random_output_len"
    lmdeploy = True

    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        input_len, output_len = config.random_input_len, config.random_output_len
        if input_len is None or output_len is None:
            raise DatasetError(missing_lengths(self.name, input_len, output_len))
        return sample_conversations(
            config.dataset,
            lambda conversations: sample_random_requests(
                conversations.pairs,
                input_len,
                output_len,
                config.num_prompts,
                config.random_range_ratio,
                tokenizer,
                config.seed,
            ),
        )

    def problems(self, config: RunConfig) -> list[str]:
        data = config.dataset
        missing = missing_lengths(self.name, data.random_input_len, data.random_output_len)
        return [*([missing] if missing else []), *super().problems(config)]

    def output_file_tag(self, data: Any) -> str:
        return f"{data.random_input_len}_{data.random_output_len}"
