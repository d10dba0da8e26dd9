"""The History page's parts: the import section, the filters, the table of runs, downloads and delete with
confirmation (the comparison of the selected runs is `compare_view`'s).

A table selection is a list of row positions, valid only for the exact rows on show; the table's key
carries a digest of those rows, so filtering, importing or deleting starts a fresh table instead of one whose
selection silently points at other runs. The runs ticked are kept by run id (PICKED_RUNS), and a fresh table starts
with the rows of those still on show ticked.
"""

from __future__ import annotations

import zlib

import pandas as pd
import streamlit as st

from bench_core.errors import HistoryError
from bench_core.hardware.run_flags import FLAG_TAGS_HELP, flag_tags
from bench_core.measure.catalog import KEY_COLUMNS
from bench_core.store.history import History
from bench_core.views import run_diff, tables
from dashboard.table_view import LONG_TABLE_ROWS, show_table
from dashboard.text import plain

# Relative to the History page's URL: the Run page, app.py's default page, is served at the app's root; "/run"
# would open it too, under a "Page not found" dialog.
RUN_PAGE_URL = "./"
# The runs table, laid out so that at 1,600 px the first view shows which run, its flags, its workload and load and
# the key results: the id (pinned), the status and flags, the dataset and the load settings that apply to it, the key
# metrics, then the rest of what ran, every other setting that differs somewhere in the rows on show, and the counts.
LEAD_COLUMNS = ("run_id", "status")
FLAGS_COLUMN = "flags"  # a run's flags' tags (machine busy, client bound): right after the status where a run has one
WORKLOAD_COLUMNS = ("dataset_name", "concurrency")
RATE_COLUMN = "request_rate"  # where a run on show was sent at a rate: its rate, its concurrency n/a
LATER_COLUMNS = (
    "load_pattern",
    run_diff.OUTPUT_LENGTH,
    "num_prompts",
    "started_at",
    "label",
    "backend",
    "model",
    "model_random_weights",
)
COUNT_COLUMNS = ("completed", "error", "source_file")
# Multiselect filters over a column's values, by its header in the table; the workload is the dataset's kind (its name),
# not its file.
FILTERS = tuple((name, tables.describe_column(name).header) for name in ("dataset_name", "backend", "model", "status"))
# What the filters read of every run, where the table reads whole rows for its page alone (a history of 100,000 runs
# read whole takes seconds): the columns filtered on, and those that say where the concurrency applies.
FILTERED_COLUMNS = (*(name for name, _ in FILTERS), "concurrency", *run_diff.Where._fields, "started_at", "label")
STARTED_FORMAT = "YYYY-MM-DD HH:mm"
# The run ids ticked in the table, kept while the filters, the page or the history change what is on show.
PICKED_RUNS = "history_picked"
NOT_RECORDED = "(not recorded)"
# The table holds one page of the runs that pass the filters, the newest run first: a table of 100,000 rows takes
# seconds to size, build and send to the browser, and nobody scrolls that far; the page picker and the filters reach
# the older runs.
TABLE_PAGE_ROWS = 1_000


def import_section(history: History) -> None:
    """Upload then Import. After an import the uploader starts empty (a new key): LMDeploy's rows carry no
    run id, so importing the same file twice would add them twice."""
    if "import_notice" in st.session_state:
        st.success(plain(st.session_state.pop("import_notice")))
    uploads = st.session_state.setdefault("import_uploads", 0)
    with st.expander("Import a CSV (this app's history, or LMDeploy's profile_*.py output)"):
        upload = st.file_uploader("CSV file", type=["csv"], key=f"import_file_{uploads}")
        if st.button("Import", key="import_button", disabled=upload is None) and upload is not None:
            try:
                new_ids = history.import_csv(upload.getvalue(), upload.name)
            except HistoryError as exc:
                st.error(plain(exc))
            else:
                st.session_state["import_notice"] = (
                    f"Imported {len(new_ids)} run(s) from {upload.name}."
                    if new_ids
                    else f"Nothing new: every run in {upload.name} is already in the history."
                )
                st.session_state["import_uploads"] = uploads + 1
                st.rerun()


def filtered(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows that pass the filter widgets (an empty filter lets everything through): workload, backend, model and
    status, the concurrency (n/a: the runs it does not apply to), the days they started and a text in the label."""
    keep = pd.Series(True, index=runs.index)
    columns = st.columns([1, 1, 1, 1, 1, 1.8, 1])
    for column, (name, label) in zip(columns, FILTERS):
        if name not in runs:
            continue
        values = runs[name].fillna("").astype(str)
        chosen = column.multiselect(
            label, sorted(values.unique()), key=f"filter_{name}", format_func=lambda value: value or NOT_RECORDED
        )
        if chosen:
            keep &= values.isin(chosen)
    concurrency = _concurrency_cells(runs)
    chosen = columns[4].multiselect(
        "Concurrency", sorted(concurrency.unique(), key=_concurrency_order), key="filter_concurrency"
    )
    if chosen:
        keep &= concurrency.isin(chosen)
    days = columns[5].date_input("Started between", value=(), key="filter_started", format="YYYY-MM-DD")
    if days:  # a range being picked has its first day only
        started = runs.get("started_at", pd.Series(index=runs.index)).astype(str).str[:10]  # the day on its clock
        keep &= (started >= days[0].isoformat()) & (started <= days[-1].isoformat())
    text = columns[6].text_input("Label contains", key="filter_label")
    if text and "label" in runs:
        keep &= runs["label"].fillna("").astype(str).str.contains(text, case=False, regex=False)
    return runs[keep]


def _concurrency_cells(runs: pd.DataFrame) -> pd.Series:
    """Each run's concurrency as the filter offers it: the number, or n/a where its load pattern takes none (a
    request rate), or NOT_RECORDED."""
    if "concurrency" not in runs:
        return pd.Series(NOT_RECORDED, index=runs.index)
    numbers = pd.to_numeric(runs["concurrency"], errors="coerce")
    texts = {number: f"{number:g}" for number in numbers.dropna().unique()}  # a history holds few values
    cells = numbers.map(texts).fillna(NOT_RECORDED)
    return cells.where(run_diff.applying(runs, ["concurrency"])["concurrency"], run_diff.NOT_APPLICABLE)


def _concurrency_order(cell: str) -> tuple[bool, float, str]:
    try:
        return False, float(cell), cell
    except ValueError:
        return True, 0.0, cell


def table_page(history: History, shown: pd.DataFrame) -> pd.DataFrame:
    """The whole rows of the page of `shown` (the runs that pass the filters, FILTERED_COLUMNS of them) that the page
    picker names (the first TABLE_PAGE_ROWS at first), the newest run first; the picker is drawn only when there is
    more than one page."""
    start = 0
    if len(shown) > TABLE_PAGE_ROWS:
        start = st.selectbox(
            f"Runs on show, {TABLE_PAGE_ROWS:,} at a time (the filters narrow them)",
            range(0, len(shown), TABLE_PAGE_ROWS),
            key="history_page",
            format_func=lambda start: (
                f"{start + 1:,} to {min(start + TABLE_PAGE_ROWS, len(shown)):,} of {len(shown):,}"
            ),
        )
    stop = len(shown) - start
    # Read in the order recorded, as `shown` is, then turned.
    return history.load(run_ids=shown["run_id"].iloc[max(stop - TABLE_PAGE_ROWS, 0) : stop]).iloc[::-1]


def table_view(shown: pd.DataFrame) -> pd.DataFrame:
    """The runs on show as the table lists them (see LEAD_COLUMNS): a setting's cell is blank where it does not apply
    to that run (a request-rate run's concurrency), its flags are their tags, its start a time."""
    frame = run_diff.with_output_length(shown)
    differing = run_diff.differing_settings(shown)
    settings = [name for name in (RATE_COLUMN, *WORKLOAD_COLUMNS, *LATER_COLUMNS, *differing) if name in frame]
    # The output length is text already, "n/a" where the dataset has none.
    judged = [name for name in settings if name in run_diff.SETTING_NAMES and name != run_diff.OUTPUT_LENGTH]
    applying = run_diff.applying(frame, judged)
    rate = [RATE_COLUMN] if RATE_COLUMN in applying and applying[RATE_COLUMN].any() else []
    order = (*LEAD_COLUMNS, *WORKLOAD_COLUMNS, *rate, *KEY_COLUMNS, *LATER_COLUMNS, *differing, *COUNT_COLUMNS)
    view = frame[[name for name in dict.fromkeys(order) if name in frame]].reset_index(drop=True)
    for name in view.columns.intersection(applying.columns):
        view[name] = view[name].where(applying[name].to_numpy())
    if "started_at" in view:  # the time as recorded, on the run's own clock
        view["started_at"] = pd.to_datetime(view["started_at"].astype(str).str[:19], errors="coerce")
    tags = flag_tags(shown).reset_index(drop=True)
    if tags.astype(bool).any():
        view.insert(view.columns.get_loc("status") + 1 if "status" in view else len(view.columns), FLAGS_COLUMN, tags)
    return view


def _picked_rows(view: pd.DataFrame) -> list[int]:
    """The rows on show of the runs ticked before (PICKED_RUNS)."""
    picked = set(st.session_state.get(PICKED_RUNS, ()))
    return [row for row, run_id in enumerate(view["run_id"].astype(str)) if run_id in picked]


def _remember_picked(on_show: list[str], selected: list[str]) -> None:
    """The ticked runs: those ticked now among the rows on show, and those ticked before that are not on show."""
    shown = set(on_show)
    kept = [run_id for run_id in st.session_state.get(PICKED_RUNS, ()) if run_id not in shown]
    st.session_state[PICKED_RUNS] = [*kept, *selected]


def runs_table(shown: pd.DataFrame) -> list[str]:
    """The table of runs on show, with a link to each on the Run page; returns the selected run ids. The runs ticked
    before stay ticked where they are still on show when the filters or the page change (PICKED_RUNS)."""
    view = table_view(shown)
    view.insert(1, "open", RUN_PAGE_URL + "?run=" + view["run_id"].astype(str))
    # The id stays in view while the many setting and result columns scroll past it.
    config = {
        "run_id": st.column_config.Column(pinned=True),
        "open": st.column_config.LinkColumn("Run page", display_text="open"),
        "started_at": st.column_config.DatetimeColumn(
            tables.describe_column("started_at").title, format=STARTED_FORMAT
        ),
    }
    for name in view.columns[2:]:
        spec = tables.describe_column(name)
        config.setdefault(
            name, st.column_config.Column(spec.header, help=spec.title if spec.header != spec.title else None)
        )
    if FLAGS_COLUMN in view:
        config[FLAGS_COLUMN] = st.column_config.Column("Flags", help=FLAG_TAGS_HELP)
    on_show = view["run_id"].astype(str).tolist()
    digest = zlib.crc32("\n".join(on_show).encode())
    event = show_table(
        view,
        key=f"history_table_{digest:08x}",
        max_rows=LONG_TABLE_ROWS,
        keep_numbers=True,
        compact=True,
        on_select="rerun",
        selection_mode="multi-row",
        selection_default={"selection": {"rows": _picked_rows(view)}},
        hide_index=True,
        column_config=config,
    )
    rows = [row for row in event.selection.rows if row < len(view)]
    selected = [on_show[row] for row in rows]
    _remember_picked(on_show, selected)
    return selected


def downloads(history: History, picked: list[str]) -> None:
    """The whole history; with one run selected, its row too (two or more: the comparison's exports hold theirs)."""
    # The whole file is written out only when the button is clicked: at 10,000 rows that takes a second.
    st.download_button(
        "Download the whole history (CSV)",
        history.to_csv_bytes,
        file_name="history.csv",
        mime="text/csv",
        key="download_history",
        on_click="ignore",
    )
    if len(picked) == 1:
        st.download_button(
            "Download the selected run's row (CSV)",
            lambda: history.to_csv_bytes(picked),
            file_name=f"history-{picked[0]}.csv",
            mime="text/csv",
            key="download_selection",
            on_click="ignore",
        )


def _ask_to_delete(run_ids: list[str]) -> None:
    st.session_state["delete_pending"] = run_ids


def _delete_pending(history: History) -> None:
    run_ids = st.session_state.pop("delete_pending", [])
    removed = history.delete(run_ids)
    st.session_state["delete_notice"] = f"Deleted {removed} run(s): {', '.join(run_ids)}."


def _keep_pending() -> None:
    st.session_state.pop("delete_pending", None)


def delete_section(history: History, picked: list[str]) -> None:
    """Two steps: the button names the selected runs, then a confirmation lists them before anything goes."""
    if "delete_notice" in st.session_state:
        st.success(plain(st.session_state.pop("delete_notice")))
    pending = st.session_state.get("delete_pending")
    if pending:
        st.warning(
            f"Delete {len(pending)} run(s) for good: {plain(', '.join(pending))}? Their history rows and "
            "folders go; every other run stays."
        )
        yes, no = st.columns(2)
        yes.button("Yes, delete them", key="delete_confirm", type="primary", on_click=_delete_pending, args=(history,))
        no.button("No, keep them", key="delete_keep", on_click=_keep_pending)
    elif picked:
        st.button(
            f"Delete the {len(picked)} selected run(s)…", key="delete_ask", on_click=_ask_to_delete, args=(picked,)
        )
