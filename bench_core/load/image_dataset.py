"""`--dataset-name image`: profile_restful_api.py's image dataset, with its rules and flags.

Text lengths follow the random dataset's rule (`--random-input-len`, `--random-output-len`, `--random-range-ratio`,
drawn from numpy's generator seeded with the seed, both bounds at least 1 as its restful client draws them); each
prompt is that many tokens drawn with `random.choices` over the tokenizer's vocabulary (less the image pad token),
decoded; the vocabulary is taken in id order, where LMDeploy's order is that of a dict the tokenizer rebuilds on each
call, so its draws can differ from run to run and ours do not. Each request carries `image_count` images of `image_resolution`, random pixels (numpy's same generator,
after the lengths, as LMDeploy's global generator runs on) or blank white, encoded as JPEG (quality 85) or PNG into
base64 data URIs; servers get them in the chat message's content, before the text.

A request's input length is counted as LMDeploy counts it, with the model's processor: the chat template applied
to the images and the text, text and vision tokens together; the vision tokens (its `facts`) are that less the
text-only prompt's. Where the model has no image processor (a text-only model), only the text is counted, and the
sample says so.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

import numpy as np

from ..config import DatasetConfig, EngineConfig, RunConfig
from ..config.catalog import image_size
from ..config.validation import BackendRules
from ..errors import DatasetError
from ..models.resolve import load_processor
from .base import Dataset
from .lengths import RANDOM_LENGTHS, missing_lengths, random_lengths
from .requests import Sample, SampledRequest, sample_of

JPEG_QUALITY = 85
MANY_LARGE_IMAGES = 100  # LMDeploy warns from this many images of 1080p or more


def sample_image_requests(tokenizer: Any, cfg: DatasetConfig) -> Sample:
    assert cfg.random_input_len is not None and cfg.random_output_len is not None, "sample_requests refuses None"
    width, height = image_size(cfg.image_resolution)
    n = cfg.num_prompts
    lengths = np.random.RandomState(cfg.seed)
    input_lens = random_lengths(lengths, cfg.random_input_len, cfg.random_range_ratio, n)
    output_lens = random_lengths(lengths, cfg.random_output_len, cfg.random_range_ratio, n)
    processor = load_processor(getattr(tokenizer, "name_or_path", ""))
    pad = getattr(processor, "image_token_id", None)
    # By id: LMDeploy takes get_vocab()'s order, which a Rust-backed tokenizer does not keep from one call to the next.
    vocabulary = sorted(token for token in set(tokenizer.get_vocab().values()) if token != pad)
    chooser = random.Random(cfg.seed)
    requests, image_bytes = [], 0
    for input_len, output_len in zip(input_lens.tolist(), output_lens.tolist()):
        text = tokenizer.decode(chooser.choices(vocabulary, k=input_len))
        pictures = [_picture(lengths, width, height, cfg.image_content) for _ in range(cfg.image_count)]
        uris = tuple(_data_uri(picture, cfg.image_format) for picture in pictures)
        image_bytes += sum(len(uri) for uri in uris)
        total, vision = count_tokens(processor, tokenizer, text, pictures)
        requests.append(
            SampledRequest(
                text, total, output_len, images=uris, facts={"vision_tokens": vision, "images": cfg.image_count}
            )
        )
    warnings, notes = (
        [],
        [
            f"{n * cfg.image_count:,} {cfg.image_content} {cfg.image_format} images of "
            f"{width}x{height}, {image_bytes // max(n, 1):,} bytes per request"
        ],
    )
    if width * height >= 1920 * 1080 and n * cfg.image_count >= MANY_LARGE_IMAGES:
        warnings.append(
            f"High resolution ({width}x{height}) with {n * cfg.image_count:,} images in all may take a "
            "long time to make and send; consider a lower resolution or fewer images."
        )
    if processor is None:
        notes.append(
            "the model has no image processor (a text-only model): input lengths count the text only, "
            "not the images' tokens"
        )
    sample = sample_of(requests, warnings=warnings, notes=notes)
    sample.arrival_rng = lengths
    return sample


def count_tokens(processor: Any, tokenizer: Any, text: str, pictures: list) -> tuple[int, float]:
    """(text and vision tokens, vision tokens) of a prompt, as profile_restful_api.py counts them with the
    processor; without one, (text tokens, NaN)."""
    if processor is None:
        return len(tokenizer.encode(text)), float("nan")
    content = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": text}]
    try:
        templated = processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that takes no content list (InternVL's): LMDeploy's <image> tag instead
        templated = f"<image>{text}"
    total = int(processor(text=[templated], images=pictures, padding=False, return_tensors="np")["input_ids"].size)
    try:
        text_only = processor.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        text_tokens = int(processor(text=[text_only], padding=False, return_tensors="np")["input_ids"].size)
    except Exception:
        text_tokens = len(tokenizer.encode(text))
    return total, float(total - text_tokens)


def _picture(rng: np.random.RandomState, width: int, height: int, content: str):
    from PIL import Image

    if content == "blank":
        pixels = np.full((height, width, 3), 255, dtype=np.uint8)
    else:
        pixels = (rng.rand(height, width, 3) * 255).astype(np.uint8)
    return Image.fromarray(pixels)


def _data_uri(picture, image_format: str) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, format=image_format, quality=JPEG_QUALITY)
    return f"data:image/{image_format};base64,{base64.b64encode(buffer.getvalue()).decode()}"


class Image(Dataset):
    """profile_restful_api.py's: random text of the random dataset's lengths with images, for a vision model behind
    a server's chat endpoint."""

    name = "image"
    order = 6
    settings = (*RANDOM_LENGTHS, "image_count", "image_resolution", "image_format", "image_content")
    output_length = "random_output_len"
    reads_source = False  # its prompts are random tokens

    def sample(self, config: DatasetConfig, tokenizer: Any) -> Sample:
        if missing := missing_lengths(self.name, config.random_input_len, config.random_output_len):
            raise DatasetError(missing)
        return sample_image_requests(tokenizer, config)

    def problems(self, config: RunConfig) -> list[str]:
        data = config.dataset
        problems = (
            [missing] if (missing := missing_lengths(self.name, data.random_input_len, data.random_output_len)) else []
        )
        try:
            image_size(data.image_resolution)
        except ValueError as exc:
            problems.append(str(exc))
        return problems + super().problems(config)

    def backend_problems(self, engine: EngineConfig, backend: BackendRules) -> list[str]:
        if not backend.takes_images:
            return [
                f"The {engine.backend} engine takes text only, so it cannot run the image dataset: send it to a "
                "server of a vision model (restful, with a -chat backend) or an LMDeploy engine."
            ]
        if not backend.in_process and engine.endpoint != "chat":  # profile_restful_api.py's others drop them unsaid
            return [
                "The image dataset sends its images in chat messages: use the chat endpoint (--backend "
                "lmdeploy-chat, vllm-chat, sglang-oai-chat or transformers-chat)."
            ]
        return []

    def output_file_tag(self, data: Any) -> str:
        return "sharegpt"  # LMDeploy's name for its image dataset's file too
