"""Which requests profile_throughput.py's --cancel-rate cancels, and after how many tokens.

Drawn as its process_request draws them, request by request from Python's `random` as its sampling left it
(Sample.cancel_rng): a draw below the rate picks the request, a second one, uniform over 0..output_len + 1 (both
ends included), the token count its worker may read before it stops. A worker stops once it has read more than
that, so only draws up to output_len - 2 cut a request short; the others let it complete.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def cancel_points(output_lens: Sequence[int], cancel_rate: float, rng: random.Random) -> list[int | None]:
    """Per request, the tokens after which it is cancelled; None for a request the rate does not pick. Without a
    rate nothing is drawn, as in their script."""
    if cancel_rate <= 0:
        return [None] * len(output_lens)
    return [rng.randint(0, output_len + 1) if rng.random() < cancel_rate else None for output_len in output_lens]
