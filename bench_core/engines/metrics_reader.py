"""The reader of a server's Prometheus page, in a process of its own that `server_metrics.MetricsScraper` starts.

A page can be huge: a label per request or per LoRA adapter gives a name 300,000 label sets, some 20 MB. Parsed
in the client's process, in a thread, a read held the GIL for seconds every interval, and the client's token
timestamps slipped by as much (P99 ITL 626 ms against a server sending a token every 100 ms). Here a read costs
this process's CPU only, and little of it: `read_page` finds the lines of the names asked for with byte
searches, parses only those, and leaves out of the read a name with more than `max_label_sets` label sets
(jumping past its block: a family's lines are one group in Prometheus text). The GET is the run's transport
(`http_stream.fetch`): the whole response within the timeout, at most `max_bytes` of it.

The parent writes the config as one JSON line on stdin (the URL, the headers, which carry the API key: never
on the command line, where `ps` shows it; the interval, timeout, size bound, names, label sets per name and the
network policy), then reads one JSON line per read on stdout:

    {"time_s": t, "samples": [[name, labels as JSON, value], ...], "crowded": [name, ...]}
    {"time_s": t, "unreachable": sentence}   the page could not be fetched (an HTTP error, no connection, ...)
    {"time_s": t, "unreadable": sentence}    what came is not Prometheus text

The lines are orjson's, which writes a value JSON cannot hold (NaN, +Inf) as null: such a value comes as its
text ("nan", "inf") instead, and `float()` reads either. `time_s` is the middle of the GET on `time.perf_counter`,
CLOCK_MONOTONIC on Linux: one clock for every process of the machine, the run's too. A first read with nothing of
ours in it (no page, or none of the names) is the last: the run has no server metrics. A line "stop" on stdin asks
for one last read before leaving; stdin closing (the parent is gone) ends the process at once, as does SIGINT
(Ctrl-C reaches the whole process group), quietly.

Its imports are the standard library's, orjson and the transport's: `reader_command` starts it without running
bench_core/engines/__init__.py, whose backend registry imports pandas and numpy (1.5 CPU s, 100 MB).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

import orjson

from .http_route import NetworkPolicy
from .http_stream import HTTPStreamError, failure_sentence, fetch, status_sentence

MAX_LABEL_SETS = 1000  # of one name in one read: past that the name is left out of the read
PARSER_MESSAGE_CHARS = 120  # of the line quoted when a page is not Prometheus text: an HTML page's, perhaps
STOP = "stop"

# A sample line: its name, its label block (quoted values may hold braces and escaped quotes), its value.
_LABEL_BLOCK = rb'\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\}'
_SAMPLE = re.compile(rb"([a-zA-Z_:][a-zA-Z0-9_:]*)(" + _LABEL_BLOCK + rb")?[ \t]+([^ \t\r\n]+)")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPED = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclasses.dataclass
class PageRead:
    """The samples of the names asked for, as (name, labels as JSON with sorted keys, value); and the names left
    out for having more label sets than a read keeps."""

    samples: list[tuple[str, str, float]]
    crowded: list[str]


def read_page(page: bytes, names: frozenset[str], max_label_sets: int = MAX_LABEL_SETS) -> PageRead:
    """The samples of `names` on a Prometheus text page; ValueError when a line of theirs is no sample, or when the
    page has none of them and its first sample line is none either (an HTML page, JSON)."""
    wanted = {name.encode() for name in names}
    found: dict[bytes, list[re.Match[bytes]]] = {}
    crowded: list[str] = []
    # Each name's namespace ("vllm:"), searched for at line starts: a few scans at memchr speed, not a Python
    # loop over every line of the page.
    for prefix in sorted({name[: name.find(b":") + 1] or name for name in wanted}):
        start = 0 if page.startswith(prefix) else _line_start(page, prefix, 0)
        while start >= 0:
            sample = _SAMPLE.match(page, start)
            if sample is not None and (name := sample[1]) in wanted:
                lines = found.setdefault(name, [])
                if len(lines) < max_label_sets:
                    lines.append(sample)
                else:  # left out; its other lines are skipped, not read
                    crowded.append(name.decode())
                    del found[name]
                    wanted.discard(name)
                    start = max(start, page.rfind(b"\n" + name + b"{") + 1)
            elif sample is None and page.startswith(tuple(wanted), start):
                raise ValueError(_not_prometheus(page, start))
            start = _line_start(page, prefix, start + 1)
    samples = [
        (sample[1].decode(), _labels_json(sample), _value(sample)) for lines in found.values() for sample in lines
    ]
    if not samples and not crowded:
        _check_first_sample_line(page)
    return PageRead(samples, crowded)


def _line_start(page: bytes, prefix: bytes, after: int) -> int:
    """Where the next line beginning with `prefix` begins, from `after` on; -1 when none does."""
    newline = page.find(b"\n" + prefix, after - 1 if after else 0)
    return newline + 1 if newline >= 0 else -1


def _labels_json(sample: re.Match[bytes]) -> str:
    labels: dict[str, str] = {}
    if sample[2] is not None:
        text = sample[2][1:-1].decode(errors="replace")
        position = 0
        while text[position:].strip():
            pair = _LABEL.match(text, position)
            if pair is None:
                raise ValueError(_not_prometheus(sample.string, sample.start()))
            labels[pair[1]] = _ESCAPED.sub(_unescaped, pair[2])
            position = pair.end()
    return json.dumps(labels, sort_keys=True)


def _unescaped(escape: re.Match[str]) -> str:
    """A label value's escape as Prometheus text has them (\\\\, \\", \\n); any other is kept as written, as
    prometheus_client keeps it."""
    return _ESCAPES.get(escape[1], escape[0])


def _value(sample: re.Match[bytes]) -> float:
    try:
        return float(sample[3])
    except ValueError:
        raise ValueError(_not_prometheus(sample.string, sample.start())) from None


def _check_first_sample_line(page: bytes) -> None:
    position = 0
    while position < len(page):
        end = page.find(b"\n", position)
        end = len(page) if end < 0 else end
        line = page[position:end].strip()
        if line and not line.startswith(b"#"):
            if (sample := _SAMPLE.match(line)) is None:
                raise ValueError(_not_prometheus(line, 0))
            _value(sample)
            return
        position = end + 1


def _not_prometheus(page: bytes, start: int) -> str:
    end = page.find(b"\n", start)
    line = page[start : end if end >= 0 else len(page)].decode(errors="replace").strip()
    return f"not Prometheus text (a line reads {line[:PARSER_MESSAGE_CHARS]!r})"


# ---- the reading process ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """What the parent tells the reader on its stdin."""

    url: str  # without user-info: the credentials go in `headers`
    headers: dict[str, str]
    interval_s: float
    timeout_s: float
    max_bytes: int
    names: list[str]
    max_label_sets: int = MAX_LABEL_SETS
    network: dict = dataclasses.field(default_factory=lambda: dataclasses.asdict(NetworkPolicy()))

    def to_line(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode() + b"\n"


def read_once(config: ReaderConfig, names: frozenset[str], policy: NetworkPolicy) -> dict:
    """One read of the page, as the line that tells it (the module's docstring lists them)."""
    sent = time.perf_counter()
    try:
        response = fetch(config.url, config.headers, policy, config.timeout_s, config.max_bytes)
    except HTTPStreamError as exc:
        return {"time_s": (sent + time.perf_counter()) / 2, "unreachable": failure_sentence(config.url, exc)}
    time_s = (sent + time.perf_counter()) / 2
    if response.status != 200:
        return {"time_s": time_s, "unreachable": status_sentence(config.url, response)}
    try:
        read = read_page(response.body, names, config.max_label_sets)
    except ValueError as exc:
        return {"time_s": time_s, "unreadable": f"{config.url} is {exc}."}
    samples = [(name, labels, value if math.isfinite(value) else str(value)) for name, labels, value in read.samples]
    return {"time_s": time_s, "samples": samples, "crowded": read.crowded}


def main() -> None:
    line = sys.stdin.readline()
    if not line:  # the parent went before it said what to read
        return
    config = ReaderConfig(**json.loads(line))
    names, policy = frozenset(config.names), NetworkPolicy(**config.network)
    stopping = threading.Event()
    threading.Thread(target=_listen, args=(stopping,), name="parent", daemon=True).start()
    first, last = True, False
    while True:
        outcome = read_once(config, names, policy)
        _say(outcome)
        if last or (first and not (outcome.get("samples") or outcome.get("crowded"))):
            return
        first = False
        last = stopping.wait(config.interval_s)


def _listen(stopping: threading.Event) -> None:
    """Stop when asked; leave at once when the parent is gone (stdin closed) or closed it."""
    for line in sys.stdin:
        if line.strip() == STOP:
            stopping.set()
    os._exit(0)


def _say(outcome: dict) -> None:
    try:
        sys.stdout.buffer.write(orjson.dumps(outcome) + b"\n")
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the parent is gone
        os._exit(0)


# The reader's interpreter: SIGINT ends it at once and quietly, as the default action does (unless the parent
# runs with SIGINT ignored, as a background job does: then it stays ignored here too); and bench_core.engines is a
# bare package there, so that importing this module runs none of the registry in bench_core/engines/__init__.py.
_BOOTSTRAP = """\
import signal, sys, types
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
sys.path.insert(0, {root!r})
engines = types.ModuleType("bench_core.engines")
engines.__path__ = [{engines!r}]
sys.modules["bench_core.engines"] = engines
from bench_core.engines.metrics_reader import main
main()
"""


def reader_command() -> list[str]:
    """The command line of a reader process (its config goes on its stdin)."""
    engines = Path(__file__).resolve().parent
    return [sys.executable, "-c", _BOOTSTRAP.format(root=str(engines.parents[1]), engines=str(engines))]
