"""`--dataset-name sharegpt`: LMDeploy's, the conversations' first prompt and answer, with their own lengths (or
--sharegpt-output-len for every answer), sampled as load/datasets.py::sample_sharegpt_requests does."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import DatasetConfig
from .base import Dataset
from .datasets import sample_conversations, sample_sharegpt_requests
from .requests import Sample


class ShareGPT(Dataset):
    name = "sharegpt"
    order = 0
    settings = ("sharegpt_output_len",)
    output_length = "sharegpt_output_len"
    lmdeploy = True

    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        def draw(conversations) -> Sample:
            sample = sample_sharegpt_requests(
                conversations.pairs, config.num_prompts, tokenizer, config.seed, config.sharegpt_output_len
            )
            sample.arrival_rng = np.random.RandomState(config.seed)  # its shuffle draws from `random`, not numpy
            return sample

        return sample_conversations(config.dataset, draw)
