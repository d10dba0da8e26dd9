"""A GGUF file dequantised into a bfloat16 Hugging Face model folder, in a process of its own.

`python -m bench_core.models.gguf_convert FILE.gguf OUT` writes the model and its tokenizer to the folder OUT.
models.py starts it as a new process because transformers decides once per process whether accelerate
is installed (`is_accelerate_available` is cached, and what it guards is imported when transformers
is): a package installed while the dashboard is running is only seen by a process started after it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # A model loaded from GGUF refuses to be saved while it remembers its quantisation; the weights are
    # already dequantised, so forgetting it is safe.
    model.hf_quantizer = None  # type: ignore[assignment]  # typed by torch's Module.__setattr__: tensors, modules
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(argv: list[str]) -> int:
    """Convert; on failure print the cause as the last line of stderr and return 1."""
    from .resolve import last_line

    gguf, out = (Path(arg) for arg in argv)
    try:
        convert(gguf, out)
    except Exception as exc:
        print(last_line(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
