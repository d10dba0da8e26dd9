"""What Start is about to run, said before it is pressed, on the Run and Sweep pages: the requests, the output tokens
they ask for and the time they take at past runs' pace (bench_core.sweep.estimate), and, where that is out of
proportion (over an hour; with nothing to time it by, over a hundred thousand requests), a box to tick before Start
runs it. A box ticked for one size does not confirm another: a new size asks again."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench_core.config import RunConfig
from bench_core.errors import BenchError
from bench_core.measure.time_left import past_pace_columns
from bench_core.sweep.estimate import SweepEstimate, describe_seconds, estimate_run, out_of_proportion
from dashboard.state import get_history
from dashboard.text import plain


def describe(guess: SweepEstimate) -> str:
    """'24 requests, about 768 output tokens; takes about 1 min 30 s, a rough CPU estimate (...)'."""
    requests = f"{guess.requests:,} request{'' if guess.requests == 1 else 's'}"
    tokens = f"{guess.output_tokens:,.0f} output tokens"
    size = f"at most {requests} and {tokens}" if guess.most else f"{requests}, about {tokens}"
    if guess.seconds is None:
        return f"{size}; no duration estimate: {guess.basis}"
    return f"{size}; takes {describe_seconds(guess.seconds)}, {guess.basis}"


def confirmed(guess: SweepEstimate, key: str) -> bool:
    """Whether Start may run what `guess` estimates: at once, or, out of proportion, once the box drawn here (in the
    current container) is ticked for this very size."""
    reason = out_of_proportion(guess)
    if not reason:
        return True
    return st.checkbox(
        plain(f"Start it anyway: {reason}"),
        key=f"{key}_{guess.requests}_{round(guess.output_tokens)}",
        help="Lower the number of prompts or the output length for a shorter run, or tick to run it as it is.",
    )


def run_confirmed(config: RunConfig | None) -> bool:
    """The Run page's estimate for `config` (None: the sidebar's settings make no run yet), in the current
    container, and whether Start may run it."""
    if config is None:
        return True
    try:
        # The pace's columns alone: the whole table of 100,000 runs takes seconds to read. The history keeps them
        # until its next write, so a rerun reads nothing.
        runs = get_history().load(past_pace_columns(config))
    except BenchError:
        runs = pd.DataFrame()  # an unreadable history: the estimate goes by the rough figure, if any
    guess = estimate_run(config, runs)
    st.caption(plain(f"This run: {describe(guess)}."))
    return confirmed(guess, "confirm_run")
