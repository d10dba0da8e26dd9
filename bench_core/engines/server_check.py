"""A server's connection check, before any run (the Run page's "Test connection", `doctor --server URL`): the models it
serves and its kind (server_identity), whether its /metrics page has series a run reads, and, where its kind is sent
ignore_eos, whether it honours it: one request asked for IGNORE_EOS_PROBE_TOKENS tokens with ignore_eos, its tokens
counted. Every finding is one line; the server's own words in them are outside text for whoever shows them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import EngineConfig
from ..config.catalog import AUTO_SERVER_KIND
from ..load.requests import SampledRequest
from .http_stream import HTTPStreamError, failure_sentence, fetch, status_sentence
from .metrics_reader import read_page
from .openai_client import ServerError, auth_headers, run_requests
from .openai_engine import server_spec
from .openai_request import ServerSpec, api_root, ignore_eos_sent
from .server_identity import ServerIdentity, identify_server
from .server_metrics import KNOWN_NAMES, METRICS_SWITCHES, SERVER_METRICS

IGNORE_EOS_PROBE_TOKENS = 4
_PROBE_PROMPT = "Hi"  # one token or so: the answer, not the prompt, is what is counted


@dataclass(frozen=True)
class ConnectionCheck:
    findings: list[tuple[str, str]]  # (what was checked, what was found), in the order checked
    reachable: bool  # the server answered GET /v1/models

    def text(self) -> str:
        return "\n".join(f"{what}: {found}" for what, found in self.findings)


def check_connection(engine: EngineConfig, timeout_s: float = 10.0) -> ConnectionCheck:
    """The check of the server `engine` names; ConfigError (one line) where its settings cannot make a request."""
    spec = server_spec(engine)
    root = api_root(spec.base_url)
    try:
        identity = identify_server(root, spec.api_key, spec.network, timeout_s)
    except ServerError as exc:
        return ConnectionCheck([("Server", str(exc))], reachable=False)
    kind = identity.kind if engine.server_kind == AUTO_SERVER_KIND else engine.server_kind
    findings = [
        ("Models served", ", ".join(identity.models) or "none listed: name the model to benchmark"),
        ("Server kind", _kind_finding(engine.server_kind, identity)),
        ("Metrics (/metrics)", _metrics_finding(root + "/metrics", spec, kind, timeout_s)),
    ]
    model = engine.model.strip() or next(iter(identity.models), "")
    findings.append(("ignore_eos", _ignore_eos_finding(dataclasses.replace(spec, server_kind=kind), model)))
    return ConnectionCheck(findings, reachable=True)


def _kind_finding(chosen: str, identity: ServerIdentity) -> str:
    detected = identity.note.removeprefix("server kind: ")
    if chosen == AUTO_SERVER_KIND:
        return detected
    return f"{chosen} (chosen; what the server says: {detected})"


def _metrics_finding(url: str, spec: ServerSpec, kind: str, timeout_s: float) -> str:
    switch = METRICS_SWITCHES.get(kind, "")
    hint = f" (the server turns them on with {switch})" if switch else ""
    try:
        response = fetch(url, auth_headers(spec.api_key, url), spec.network, timeout_s)
    except HTTPStreamError as exc:
        return f"not available: {failure_sentence(url, exc)}{hint}"
    if response.status != 200:
        return f"not available: {status_sentence(url, response)}{hint}"
    try:
        found = {name for name, _, _ in read_page(response.body, KNOWN_NAMES).samples}
    except ValueError as exc:
        return f"not available: {url} is {exc}.{hint}"
    read = [m.label for m in SERVER_METRICS if any(n in found for s in m.sources for n in s.names)]
    if not read:
        return f"a page, but none of the series a run reads{hint}"
    return f"available ({', '.join(read)})"


def _ignore_eos_finding(spec: ServerSpec, model: str) -> str:
    if not ignore_eos_sent(spec.server_kind, True):
        return f"not sent to a server of kind {spec.server_kind}: answers end at EOS, counted as whole"
    if not model:
        return "not checked: no model to ask"
    asked = IGNORE_EOS_PROBE_TOKENS
    run = run_requests(spec, model, [SampledRequest(_PROBE_PROMPT, 1, asked)], ignore_eos=True)
    for _ in run.events():
        pass
    result = run.results[0]
    if result.finish_reason not in ("stop", "length"):
        return f"not checked: the request failed ({result.message or result.finish_reason})"
    got = result.output_tokens
    if got >= asked:
        return f"honoured: asked for {asked} tokens with ignore_eos, {got} came back"
    return f"not honoured: asked for {asked} tokens with ignore_eos, the server stopped at EOS after {got}"
