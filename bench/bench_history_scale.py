"""What a long history costs the pages and the CLI, before and after a change, side by side in one run:

    .venv/bin/python bench/bench_history_scale.py [--rows 100 10000] [--before REV|none]

It builds histories of each size from the real rows of tests/data/history_round2 (runs of the tiny model, a server
run, LMDeploy imports; each with its run folder), new run ids and values varied, in a temporary folder. Then, in a
fresh process per version of the code (this checkout, and `git archive` of --before), on its own copy, it times
(after building the index once, untimed but reported, where the code has one):
- History.row(one id) and History.load(): the first read in a process, the next one (file unchanged), and the next
  one after another process appended a row (what the pages pay after a run ends);
- the pages through Streamlit's AppTest: the Run page's first view (its estimate reads the history), the History
  page's first view in a fresh dashboard, an interaction (typing in a filter), the view
  after a run was appended, and the Run page of one run (what the History page's "open" link shows);
- the CLI's history work for one run (cli.common.open_history and check_writable, then History.record of a run
  like the template's): everything a `python -m bench_core pipeline ...` does with the history, and nothing of the
  model run or the Python start-up, which do not depend on the history's length.
Each figure is the best of three (one where a try takes over two seconds). Printed: seconds before, after, and
before/after, per size; the machine's load average, as the figures depend on it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "data" / "history_round2"


def build_history(root: Path, rows: int) -> None:
    """A history of `rows` runs shaped like the template's: its rows in turn under new run ids (one a minute), with
    their measured values scaled by up to 10% and their labels numbered; each run of ours with its folder (the
    template's files, hard-linked)."""
    sys.path[:0] = [str(ROOT)]
    from bench_core import csvstore

    header, template = csvstore.read_table(TEMPLATE / "history.csv")
    made = []
    (root / "runs").mkdir(parents=True)
    for number in range(rows):
        base = template[number % len(template)]
        day, minute = divmod(number, 24 * 60)
        run_id = f"2025{1 + day // 28 % 12:02d}{1 + day % 28:02d}-{minute // 60:02d}{minute % 60:02d}00-{number:04x}"
        row = {**base, "run_id": run_id, "label": f"{base['label']} #{number}" if base["label"] else ""}
        factor = 1 + (number % 97) / 1000
        for column, cell in base.items():
            if "." in cell and cell.replace(".", "", 1).replace("e-", "", 1).isdigit():
                row[column] = repr(float(cell) * factor)
        made.append(row)
        folder = TEMPLATE / "runs" / base["run_id"]
        if folder.is_dir():
            (root / "runs" / run_id).mkdir()
            for path in folder.iterdir():
                os.link(path, root / "runs" / run_id / path.name)
    (root / "history.csv").write_bytes(csvstore.table_bytes(header, made))


def resident_bytes() -> int:
    """This process's resident memory now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def best(action, tries: int = 3) -> float:
    """The best time of `action` over `tries` (one try when it takes over 2 s)."""
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
        if times[-1] > 2:
            break
    return min(times)


def measure(code: Path, results: Path) -> dict[str, float]:
    """The timings, with the code at `code`, on the history at `results` (this process is that code's)."""
    sys.path[:0] = [str(code)]
    os.chdir(code)
    os.environ["BENCH_STUDIO_RESULTS"] = str(results)
    import logging

    import pandas as pd
    from streamlit.testing.v1 import AppTest

    from bench_core import csvstore
    from bench_core.cli.common import check_writable, open_history
    from bench_core.config import RunConfig
    from bench_core.store.history import History, RunRecord, local_now_iso, new_run_id
    from dashboard.state import get_history, get_runner

    logging.disable(logging.WARNING)
    _, rows = csvstore.read_table(results / "history.csv")
    shown = next(row for row in reversed(rows) if (results / "runs" / row["run_id"]).is_dir())  # a run of ours
    run_id = shown["run_id"]
    template = (
        TEMPLATE
        / "runs"
        / next(
            row["run_id"]
            for row in csvstore.read_table(TEMPLATE / "history.csv")[1]
            if row["run_id"] in {path.name for path in (TEMPLATE / "runs").iterdir()}
        )
    )

    flat = json.loads((template / "config.json").read_text())["flat"]
    cells = {key: float(value) for key, value in rows[0].items() if value and value.replace(".", "", 1).isdigit()}

    def template_run() -> RunRecord:
        return RunRecord(
            run_id=new_run_id(),
            started_at=local_now_iso(),
            status="finished",
            config=RunConfig.from_flat_dict(flat),
            metrics=cells,
            environment=json.loads((template / "environment.json").read_text()),
            requests=pd.read_parquet(template / "requests.parquet"),
        )

    def append_from_elsewhere() -> None:  # a run ending in another process (the CLI): a row more
        History(results).record(template_run())

    figures = {}
    if hasattr(History, "reindex"):  # the index a history written before it gets once, at its first read
        start = time.perf_counter()
        History(results).reindex()
        figures["index: built once from the folders"] = time.perf_counter() - start
    data_bytes = (results / "history.csv").stat().st_size
    gc.collect()
    rss_before = resident_bytes()
    kept = History(results)
    first = kept.load()  # what a page holds: the History's table and the caller's
    gc.collect()
    figures["load: resident memory it adds / history.csv size"] = (resident_bytes() - rss_before) / data_bytes
    del first, kept
    figures["row: first read"] = best(lambda: History(results).row(run_id))
    warm = History(results)
    warm.row(run_id)
    figures["row: next read"] = best(lambda: warm.row(run_id))
    figures["load: first read"] = best(lambda: History(results).load())
    warm.load()
    figures["load: next read"] = best(warm.load)

    def load_after_append() -> None:
        append_from_elsewhere()
        warm.load()

    figures["load: after a row appended"] = best(load_after_append)

    for cached in (get_history, get_runner):
        cached.clear()
    page = AppTest.from_file(str(code / "app.py"), default_timeout=600)
    start = time.perf_counter()
    page.run()
    figures["Run page: first view"] = time.perf_counter() - start
    # The History page opened first in a fresh dashboard: what the Run page read for its estimate is not kept.
    for cached in (get_history, get_runner):
        cached.clear()
    start = time.perf_counter()
    page.switch_page("app_pages/history.py").run()
    figures["History page: first view"] = time.perf_counter() - start
    assert not page.exception, page.exception
    texts = iter(f"#{n}" for n in range(1, 100))
    figures["History page: interaction"] = best(lambda: page.text_input("filter_label").input(next(texts)).run())

    def view_after_append() -> None:
        append_from_elsewhere()
        page.run()

    figures["History page: after a row appended"] = best(view_after_append)
    run_page = AppTest.from_file(str(code / "app.py"), default_timeout=600)
    run_page.query_params["run"] = run_id
    figures["Run page of one run"] = best(lambda: run_page.run())
    assert not run_page.exception, run_page.exception

    def cli_run() -> None:
        history = open_history(str(results))
        check_writable(history)
        history.record(template_run())

    cli_run()  # as the run before it left the folder
    figures["CLI: history work of one run"] = best(cli_run)
    for cached in (get_history, get_runner):
        cached.clear()
    return figures


def checkout(rev: str, folder: Path) -> Path:
    """The project's files at `rev`, extracted into `folder`."""
    folder.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def timings(code: Path, results: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--measure", str(code), str(results)], cwd=code, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"measuring {code} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument(
        "--before",
        default="40be792",
        help="the revision to compare with, 'none' for this checkout alone (default: %(default)s, the last whose "
        "history was a CSV file read as a database)",
    )
    parser.add_argument("--measure", nargs=2, metavar=("CODE", "RESULTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), Path(args.measure[1]))))
        return 0
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average {load_average()}"
    )
    table: dict[int, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        codes = {"after": ROOT}
        if args.before != "none":
            codes["before"] = checkout(args.before, Path(folder) / "before")
        for rows in args.rows:
            histories = {name: Path(folder) / f"{name}-{rows}" for name in codes}
            for path in histories.values():
                build_history(path, rows)
            measured = {name: timings(code, histories[name]) for name, code in codes.items()}
            measured.setdefault("before", {})
            table[rows] = {
                key: (measured["before"].get(key, math.nan), measured["after"][key]) for key in measured["after"]
            }
            for path in histories.values():
                shutil.rmtree(path)
    print(f"load average after: {load_average()}")
    width = max(len(key) for figures in table.values() for key in figures)
    print(f"{'seconds':<{width}}" + "".join(f" | {rows:>6} rows: before  after  ratio" for rows in table))
    for key in next(iter(table.values())):
        cells = ""
        for rows in table:
            then, now = table[rows][key]
            cells += f" | {then:>17.3f} {now:6.3f} {then / max(now, 1e-6):5.1f}x"
        print(f"{key:<{width}}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
