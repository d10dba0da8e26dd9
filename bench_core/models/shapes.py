"""How many parameters a dense decoder (Llama, Qwen2 and their kin) holds, from its sizes: the one formula that
both the synthetic models (the size of a build) and the roofline (the bytes a decode step reads) count with.

Pure functions; parameters counted as the Hugging Face models hold them.
"""

from __future__ import annotations

import dataclasses

# Model types whose q, k and v projections carry a bias without saying so in their config.
QKV_BIAS_MODEL_TYPES = ("qwen2",)


@dataclasses.dataclass(frozen=True)
class DecoderSizes:
    """The sizes that a dense decoder's parameter count follows from."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qkv_bias: bool


def has_qkv_bias(model_type: str | None, attention_bias: bool = False) -> bool:
    """Whether the q, k and v projections carry a bias: Qwen2's always do, others' when the config says so."""
    return model_type in QKV_BIAS_MODEL_TYPES or attention_bias


def layer_parameters(sizes: DecoderSizes) -> int:
    """One decoder layer: attention's q, k, v and o projections (and the biases), the gated MLP's gate, up and
    down projections, and the layer's two norms."""
    q = sizes.heads * sizes.head_dim
    kv = sizes.kv_heads * sizes.head_dim
    attention = sizes.hidden * q * 2 + sizes.hidden * kv * 2
    if sizes.qkv_bias:
        attention += q + 2 * kv
    return attention + 3 * sizes.hidden * sizes.intermediate + 2 * sizes.hidden


def stack_parameters(sizes: DecoderSizes) -> int:
    """Every decoder layer and the final norm: all but the embedding table and the output projection."""
    return sizes.layers * layer_parameters(sizes) + sizes.hidden


def vocabulary_table_parameters(sizes: DecoderSizes) -> int:
    """One vocabulary-by-hidden table: the input embedding, or the output projection (the same one when tied)."""
    return sizes.vocab * sizes.hidden


def parameter_count(sizes: DecoderSizes, tied_embeddings: bool) -> int:
    """Every parameter of the model, tied embeddings counted once."""
    tables = 1 if tied_embeddings else 2
    return stack_parameters(sizes) + tables * vocabulary_table_parameters(sizes)
