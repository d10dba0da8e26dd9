"""The Playground page's parts: the engine choice (the sidebar's model picker), the prompts typed or
uploaded, the generation settings, and a job's answers, polled while it runs, with their downloads.
"""

from __future__ import annotations

import streamlit as st

from bench_core.config import EngineConfig, GenerationSettings
from bench_core.engines import backends
from bench_core.errors import BenchError
from bench_core.load.playground import (
    FILE_TYPES,
    parse_prompt_file,
    prompts_from_text,
    results_frame,
    results_to_csv_bytes,
    results_to_jsonl_bytes,
)
from bench_core.run.runner import PlaygroundJob
from bench_core.states import RunState
from dashboard import engine_widgets, url_settings
from dashboard.sidebar import DEFAULT_BACKEND
from dashboard.state import get_runner
from dashboard.table_view import show_table
from dashboard.text import plain

POLL_S = 1.0
RESULT_COLUMN_CONFIG = {
    "index": st.column_config.NumberColumn("#", width="small"),
    "prompt": st.column_config.TextColumn("Prompt", width="medium"),
    "text": st.column_config.TextColumn("Response", width="large"),
    "input_tokens": st.column_config.NumberColumn("Input (tokens)", help="The prompt after the chat template."),
    "output_tokens": st.column_config.NumberColumn("Output (tokens)"),
    "finish_reason": st.column_config.TextColumn(
        "Finish", help="stop: the model ended its answer (EOS); length: it reached the max new tokens."
    ),
    "ttft_s": st.column_config.NumberColumn(
        "TTFT (s)", format="%.3f", help="From handing the batch to the engine to the first token."
    ),
    "total_s": st.column_config.NumberColumn("Total (s)", format="%.3f"),
    "error": st.column_config.TextColumn("Error"),
}
# Timings first: a long answer in the grid would push them off-screen. Answers are shown whole below it.
RESULT_COLUMN_ORDER = (
    "index",
    "ttft_s",
    "total_s",
    "output_tokens",
    "finish_reason",
    "input_tokens",
    "prompt",
    "text",
    "error",
)


def engine_choice() -> EngineConfig:
    """Backend and model; when they match the engine in memory its full settings are reused, and so is it."""
    left, right = st.columns(2)
    names = list(backends())
    backend = left.selectbox("Backend", names, index=names.index(DEFAULT_BACKEND), key="pg_backend")
    model = engine_widgets.model_picker(right, key_prefix="pg_", draw=url_settings.drawn)
    loaded = get_runner().loaded_engine()
    if loaded is not None and (loaded.backend, loaded.model) == (backend, model):
        st.caption("Uses the engine already in memory.")
        return loaded
    if loaded is not None:
        st.caption(plain(f"In memory now: {loaded.model} on {loaded.backend}; running here loads {model} instead."))
    return EngineConfig(backend=backend, model=model)


def prompt_input(shown: PlaygroundJob | None) -> tuple[list, str | None]:
    """The conversations to run (an uploaded file wins over typed lines) and the file's problem, if any.

    A session opened on a job's link (a reload, a shared URL) starts with that job's prompts in the box, said
    to be them, so that what looks like prompts there is what ran; the placeholder reads as an example.
    """
    ran = _typed_prompts(shown)
    if ran is not None and "pg_prompts" not in st.session_state:
        st.session_state["pg_prompts"] = ran
    typed = st.text_area(
        "Prompts, one per line", key="pg_prompts", height=150, placeholder="e.g. What is the capital of France?"
    )
    if ran is not None and typed == ran:
        st.caption(plain(f"The prompts of job {shown.job_id}, as it ran them; its answers are below."))
    upload = st.file_uploader(
        "…or a prompt file",
        type=list(FILE_TYPES),
        key="pg_file",
        help='Text: one prompt per line. CSV: a \'prompt\' column. JSONL: {"prompt": ...} or {"messages": [...]} '
        'per line. JSON: a list of conversations, each a list of {"role", "content"} messages.',
    )
    if upload is None:
        return prompts_from_text(typed), None
    try:
        conversations = parse_prompt_file(upload.name, upload.getvalue())
    except BenchError as exc:
        return [], str(exc)
    st.caption(plain(f"{len(conversations)} conversation(s) from {upload.name} (the typed prompts are not used)."))
    return conversations, None


def _typed_prompts(job: PlaygroundJob | None) -> str | None:
    """The job's prompts as the box holds them, one per line; None without a job, or for conversations that a
    line cannot hold (a file's system or assistant turns, a prompt of several lines)."""
    if job is None or not all(
        len(turns) == 1 and turns[0]["role"] == "user" and "\n" not in turns[0]["content"]
        for turns in job.conversations
    ):
        return None
    return "\n".join(turns[0]["content"] for turns in job.conversations)


def generation_settings() -> tuple[GenerationSettings, int]:
    tokens, sampling, temperature, top_p, top_k = st.columns(5)
    max_new_tokens = tokens.number_input("Max new tokens", min_value=1, max_value=32768, value=128, key="pg_max_new")
    do_sample = sampling.toggle("Sampling", key="pg_sampling", help="Off: greedy decoding, the same answer each time.")
    generation = GenerationSettings(
        ignore_eos=False,
        do_sample=do_sample,
        temperature=temperature.slider("Temperature", 0.01, 2.0, 0.7, key="pg_temperature", disabled=not do_sample),
        top_p=top_p.slider("top_p", 0.01, 1.0, 0.95, key="pg_top_p", disabled=not do_sample),
        top_k=top_k.number_input(
            "top_k",
            min_value=0,
            max_value=1000,
            value=50,
            key="pg_top_k",
            disabled=not do_sample,
            help="0 turns it off.",
        ),
    )
    return generation, int(max_new_tokens)


def show_job(job: PlaygroundJob) -> None:
    @st.fragment(run_every=POLL_S if job.active else None)
    def live() -> None:
        total, done = len(job.conversations), len(job.results)
        status = f"{job.state}: {done} of {total} prompt(s) answered"
        if job.state == RunState.QUEUED:
            status += f", {get_runner().queue_position(job)} job(s) ahead"
        st.progress(done / total, text=plain(status))
        if job.state == RunState.FAILED:
            st.error(plain(job.message))
        elif job.message:
            st.info(plain(job.message))
        if job.results:
            results = results_frame(job.results)
            show_table(
                results,
                key="pg_results",
                keep_numbers=True,
                hide_index=True,
                column_config=RESULT_COLUMN_CONFIG,
                column_order=RESULT_COLUMN_ORDER,
            )
            _answers(results)
        if was_active and not job.active:
            st.rerun()  # once more in full: the downloads appear and the polling stops

    was_active = job.active
    if job.engine_info is not None:
        st.caption(
            plain(
                f"{job.engine_info.model} on {job.engine_info.backend} ({job.engine_info.device}, "
                f"{job.engine_info.dtype})"
            )
        )
    live()
    if job.active:
        st.button("Cancel", key="pg_cancel", on_click=job.cancel)
    elif job.results:
        csv_col, jsonl_col = st.columns(2)
        csv_col.download_button(
            "Download results (CSV)",
            results_to_csv_bytes(job.results),
            file_name=f"playground-{job.job_id}.csv",
            mime="text/csv",
            key="pg_download_csv",
            on_click="ignore",
        )
        jsonl_col.download_button(
            "Download results (JSONL)",
            results_to_jsonl_bytes(job.results),
            file_name=f"playground-{job.job_id}.jsonl",
            mime="application/jsonl",
            key="pg_download_jsonl",
            on_click="ignore",
        )


def _answers(results) -> None:
    """Each answer in full, wrapped, under its prompt (the grid cuts long text to one line)."""
    for row in results.to_dict("records"):
        with st.expander(plain(f"#{row['index']} {_first_line(row['prompt'])}")):
            st.code(row["text"] or row["error"], language=None, wrap_lines=True)


def _first_line(text: str, width: int = 80) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"
