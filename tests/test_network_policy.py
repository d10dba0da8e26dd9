"""Issue 36: every request of a run, its GETs (model discovery at /v1/models, /metrics) as its streamed POSTs, goes
through one transport under one policy (`http_stream.NetworkPolicy`): proxies from the environment (loopback always
direct; --no-proxy-env: none), TLS against the system's store, a --ca-bundle or none (--insecure), and redirects
followed within the server's origin only. The GETs went through urllib before: a 302 to another host got the API key,
and with http_proxy set the GETs used the proxy while the streams did not.

Real servers on 127.0.0.1 (tests/raw_http_server.py, answering as tests/llama_server.py's NEVER: a server that keeps
its connections) and a real forward proxy (tests/forward_proxy.py), which alone knows where `bench-target.invalid`
is: a request for that name that does not go through the proxy cannot reach the server.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import ssl
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from forward_proxy import TARGET_HOST, ForwardProxy
from llama_server import MODEL, NEVER, llama_handler, send_all
from raw_http_server import Handler, RawServer, respond, respond_json
from restful_cli import RestfulRun, restful

from bench_core.engines.http_route import NetworkPolicy, Origin
from bench_core.engines.openai_client import ServerError, discover_model

SECRET = "sk-network-secret-0123456789"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
TOKENS = 4
N = 4


@pytest.fixture(autouse=True)
def no_network_settings(monkeypatch):
    """No proxy, CA or key setting of the machine's: each test sets what it is about."""
    for name in (*PROXY_VARIABLES, *(v.upper() for v in PROXY_VARIABLES), "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate (cert.pem, key.pem) for 127.0.0.1 and bench-target.invalid."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1"]
        + ["-subj", "/CN=127.0.0.1", "-addext", f"subjectAltName=IP:127.0.0.1,DNS:{TARGET_HOST}"],
        check=True,
        capture_output=True,
    )
    return cert, key


def server_tls(certificate) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    return context


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def run_all(url: str, n: int = N, **spec):
    return send_all(url, n, TOKENS, **spec)


def run_cli(url: str, folder: Path, capsys, *flags: str) -> RestfulRun:
    """A restful run of N requests for TOKENS tokens each, the model discovered unless `flags` name it."""
    return restful(url, folder, capsys, *flags, prompts=N, output_len=TOKENS)


def completed_every_request(run: RestfulRun, n: int = N) -> None:
    assert run.code == 0, run.err
    assert (run.summary["completed"], len(run.table)) == (n, n)
    assert run.table["status"].eq("success").all()


def one_sentence_on_stderr(run: RestfulRun) -> str:
    """The run's one message: one line, one sentence, no traceback, nothing recorded."""
    lines = [line for line in run.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in run.err, run.err
    sentences = re.split(r"(?<=[.?!])\s+(?=[A-Z])", lines[0].strip())
    assert len(sentences) == 1, lines[0]
    assert run.summary is None
    return lines[0]


# ---- proxies ---------------------------------------------------------------------------------------------------


@pytest.fixture
def target():
    """The server, reachable as http://bench-target.invalid:PORT only through the proxy, and the proxy."""
    with RawServer(llama_handler(NEVER)) as server, ForwardProxy({TARGET_HOST: "127.0.0.1"}) as proxy:
        yield server, proxy, f"http://{TARGET_HOST}:{port_of(server.url)}"


@pytest.mark.slow
def test_with_http_proxy_set_discovery_the_streams_and_the_metrics_reads_all_go_through_the_proxy(
    target, tmp_path, capsys, monkeypatch
):
    server, proxy, url = target
    monkeypatch.setenv("http_proxy", proxy.url)
    run = run_cli(url, tmp_path, capsys)  # no --model: discovered; server metrics on
    completed_every_request(run)
    relayed = proxy.paths()
    assert relayed[0] == ("GET", "/v1/models")
    assert relayed.count(("POST", "/v1/completions")) == N
    assert ("GET", "/metrics") in relayed
    assert {relayed_to.split("/")[2] for _, relayed_to in proxy.log} == {f"{TARGET_HOST}:{port_of(server.url)}"}
    assert len(server.log) == len(proxy.log)  # the server heard nothing the proxy did not relay
    assert {r.headers["host"] for r in server.log} == {f"{TARGET_HOST}:{port_of(server.url)}"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "bypass",
    [
        pytest.param({"NO_PROXY": TARGET_HOST}, id="NO_PROXY"),
        pytest.param({"no_proxy": f"example.org,{TARGET_HOST}"}, id="no_proxy-list"),
        pytest.param({"flag": "--no-proxy-env"}, id="no-proxy-env-flag"),
    ],
)
def test_a_host_the_proxy_is_bypassed_for_is_looked_up_directly_and_an_unresolvable_one_is_one_sentence(
    target, tmp_path, capsys, monkeypatch, bypass
):
    server, proxy, url = target
    monkeypatch.setenv("http_proxy", proxy.url)
    for name, value in bypass.items():
        if name != "flag":
            monkeypatch.setenv(name, value)
    flags = [bypass["flag"]] if "flag" in bypass else []
    run = run_cli(url, tmp_path, capsys, *flags)
    assert run.code == 2, run.err
    assert (proxy.log, server.log) == ([], [])
    message = one_sentence_on_stderr(run)
    assert TARGET_HOST in message
    assert re.search(r"resolv|name or service not known|name resolution|unknown host", message, re.IGNORECASE)


@pytest.mark.slow
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_requests_to_the_loopback_address_never_go_through_the_proxy(host, tmp_path, capsys, monkeypatch):
    with RawServer(llama_handler(NEVER)) as server, ForwardProxy() as proxy:
        for name in ("http_proxy", "HTTPS_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        run = run_cli(f"http://{host}:{port_of(server.url)}", tmp_path, capsys)
    completed_every_request(run)
    assert proxy.log == []
    heard = [(r.method, r.target) for r in server.log]
    assert heard[0] == ("GET", "/v1/models") and ("GET", "/metrics") in heard


@pytest.mark.slow
def test_https_goes_through_a_connect_tunnel_and_trusts_the_ca_bundle_given(certificate, tmp_path, capsys, monkeypatch):
    with (
        RawServer(llama_handler(NEVER), tls=server_tls(certificate)) as server,
        ForwardProxy({TARGET_HOST: "127.0.0.1"}) as proxy,
    ):
        monkeypatch.setenv("https_proxy", proxy.url)
        authority = f"{TARGET_HOST}:{port_of(server.url)}"
        run = run_cli(f"https://{authority}", tmp_path, capsys, "--ca-bundle", str(certificate[0]))
    completed_every_request(run)
    assert proxy.log and set(proxy.log) == {("CONNECT", authority)}  # the proxy saw tunnels, nothing inside them
    heard = [(r.method, r.target) for r in server.log]
    assert heard[0] == ("GET", "/v1/models") and heard.count(("POST", "/v1/completions")) == N
    assert ("GET", "/metrics") in heard


def test_https_through_the_proxy_is_a_connect_tunnel_for_discovery_and_streams_alike(certificate, monkeypatch):
    from bench_core.engines.http_route import NetworkPolicy

    policy = NetworkPolicy(ca_bundle=str(certificate[0]))
    with (
        RawServer(llama_handler(NEVER), tls=server_tls(certificate)) as server,
        ForwardProxy({TARGET_HOST: "127.0.0.1"}) as proxy,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        url = f"https://{TARGET_HOST}:{port_of(server.url)}"
        assert discover_model(url, network=policy) == MODEL
        results = run_all(url, network=policy)
    assert [(r.finish_reason, r.output_tokens) for r in results] == [("length", TOKENS)] * N
    assert proxy.log == [("CONNECT", f"{TARGET_HOST}:{port_of(server.url)}")] * 2  # one for the GET, one kept alive
    assert [(r.method, r.target) for r in server.log] == [("GET", "/v1/models")] + [("POST", "/v1/completions")] * N


# ---- redirects -------------------------------------------------------------------------------------------------


def redirecting(redirects: dict[tuple[str, str], tuple[int, str]], then: Handler) -> Handler:
    """Answers the (method, target)s in `redirects` with their (status, Location); anything else as `then` does."""

    async def handle(request, writer) -> bool:
        if (request.method, request.target) in redirects:
            status, location = redirects[request.method, request.target]
            request.answer = "redirected"
            await respond(writer, status, headers=[("Location", location)])
            return True
        return await then(request, writer)

    return handle


@pytest.fixture
def elsewhere():
    """The server a redirect points to: its log must stay empty."""
    with RawServer(llama_handler(NEVER)) as server:
        yield server


def test_discovery_redirected_to_another_server_is_refused_by_name_and_the_key_never_reaches_it(elsewhere):
    redirect = {("GET", "/v1/models"): (302, f"{elsewhere.url}/v1/models")}
    with RawServer(redirecting(redirect, llama_handler(NEVER))) as first:
        with pytest.raises(ServerError) as refused:
            discover_model(first.url, api_key=SECRET)
    assert [r.headers.get("authorization") for r in first.log] == [f"Bearer {SECRET}"]
    assert not any("authorization" in r.headers for r in elsewhere.log)
    assert elsewhere.log == []  # never asked at all
    message = str(refused.value)
    assert "redirect" in message.lower() and f"127.0.0.1:{port_of(elsewhere.url)}" in message
    assert SECRET not in message


@pytest.mark.slow
def test_restful_without_a_model_refuses_a_discovery_redirect_to_another_server_in_one_line(
    elsewhere, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    redirect = {("GET", "/v1/models"): (302, f"{elsewhere.url}/v1/models")}
    with RawServer(redirecting(redirect, llama_handler(NEVER))) as first:
        run = run_cli(first.url, tmp_path, capsys)
    assert run.code == 2, run.err
    lines = [line for line in run.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in run.err, run.err
    assert "redirect" in lines[0].lower() and f"127.0.0.1:{port_of(elsewhere.url)}" in lines[0]
    assert SECRET not in run.lines
    assert elsewhere.log == []


def test_discovery_redirected_within_the_same_server_is_followed():
    async def moved(request, writer) -> bool:
        if request.target == "/v1/models":
            await respond(writer, 302, headers=[("Location", "/v2/models")])
        else:
            await respond_json(writer, {"object": "list", "data": [{"id": "moved-model", "object": "model"}]})
        return True

    with RawServer(moved) as server:
        assert discover_model(server.url, api_key=SECRET) == "moved-model"
    assert [(r.target, r.headers.get("authorization")) for r in server.log] == [
        ("/v1/models", f"Bearer {SECRET}"),
        ("/v2/models", f"Bearer {SECRET}"),
    ]


def test_a_post_answered_with_a_redirect_is_not_followed_and_fails_with_its_status(elsewhere):
    redirect = {("POST", "/v1/completions"): (307, f"{elsewhere.url}/v1/completions")}
    with RawServer(redirecting(redirect, llama_handler(NEVER))) as first:
        results = run_all(first.url, 2, api_key=SECRET)
    assert [r.finish_reason for r in results] == ["error", "error"]
    assert all("HTTP 307" in r.message for r in results), [r.message for r in results]
    assert [r.answer for r in first.requests("POST")] == ["redirected", "redirected"]  # each sent once
    assert elsewhere.log == []


# ---- TLS -------------------------------------------------------------------------------------------------------


@pytest.fixture
def self_signed(certificate):
    with RawServer(llama_handler(NEVER), tls=server_tls(certificate)) as server:
        yield server


@pytest.mark.slow
def test_a_self_signed_server_is_refused_by_default_in_one_line_naming_the_certificate(self_signed, tmp_path, capsys):
    run = run_cli(self_signed.url, tmp_path, capsys)
    assert run.code == 2, run.err
    lines = [line for line in run.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in run.err, run.err
    assert re.search(r"certificate", lines[0], re.IGNORECASE) and "TLS" in lines[0], lines[0]
    assert not self_signed.requests("POST")


def test_a_self_signed_servers_streams_fail_by_default_naming_the_certificate(self_signed):
    results = run_all(self_signed.url, 2)
    assert [r.finish_reason for r in results] == ["error", "error"]
    assert all(re.search(r"certificate", r.message, re.IGNORECASE) for r in results), results[0].message
    assert self_signed.log == []


@pytest.mark.slow
@pytest.mark.parametrize("trust", ["--ca-bundle", "--insecure"])
def test_a_self_signed_server_is_benchmarked_with_the_ca_bundle_or_insecure(
    self_signed, certificate, tmp_path, capsys, trust
):
    flags = [trust, str(certificate[0])] if trust == "--ca-bundle" else [trust]
    run = run_cli(self_signed.url, tmp_path, capsys, *flags)
    completed_every_request(run)
    heard = [(r.method, r.target) for r in self_signed.log]
    assert heard[0] == ("GET", "/v1/models") and ("GET", "/metrics") in heard


@pytest.mark.parametrize("trust", ["ca_bundle", "insecure"])
def test_the_policy_trusts_a_self_signed_server_for_discovery_and_streams_alike(self_signed, certificate, trust):
    from bench_core.engines.http_route import NetworkPolicy

    policy = NetworkPolicy(ca_bundle=str(certificate[0])) if trust == "ca_bundle" else NetworkPolicy(insecure=True)
    assert discover_model(self_signed.url, network=policy) == MODEL
    results = run_all(self_signed.url, network=policy)
    assert [(r.finish_reason, r.output_tokens) for r in results] == [("length", TOKENS)] * N


# ---- the policy's rules, pure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "no_proxy, host, bypassed",
    [
        ("*", "api.example.com", True),
        ("example.com", "api.example.com", True),
        (".example.com", "api.example.com", True),
        ("*.example.com", "api.example.com", True),
        ("example.com", "example.com", True),
        ("ample.com", "api.example.com", False),  # a domain matches at a dot, not inside a label
        ("other.org, example.com", "api.example.com", True),
        ("example.com:8000", "example.com", True),
        ("example.com:9000", "example.com", False),  # a port given must match too
        ("", "example.com", False),
    ],
)
def test_no_proxy_is_read_as_curl_reads_it(monkeypatch, no_proxy, host, bypassed):
    monkeypatch.setenv("http_proxy", "http://proxy.local:3128")
    monkeypatch.setenv("no_proxy", no_proxy)
    route = NetworkPolicy().proxy_for(Origin(f"http://{host}:8000/v1"))
    assert (route is None) == bypassed
    assert NetworkPolicy(proxy_env=False).proxy_for(Origin(f"http://{host}:8000/v1")) is None


def test_a_proxy_this_client_cannot_use_is_one_clear_failure(monkeypatch):
    monkeypatch.setenv("https_proxy", "socks5://127.0.0.1:1080")
    with pytest.raises(ValueError, match="not an http:// proxy"):
        NetworkPolicy().proxy_for(Origin("https://api.example.com/v1"))
    monkeypatch.setenv("https_proxy", "127.0.0.1:3128")  # no scheme: http, as curl takes it
    assert NetworkPolicy().proxy_for(Origin("https://api.example.com/v1")).shown == "http://127.0.0.1:3128"


def test_a_get_made_under_a_running_event_loop_still_reads_the_server():
    # A notebook's loop, or the browser tests' playwright driver, runs in the calling thread: asyncio.run would refuse.
    # The test's own loop runs in a thread of its own, since the suite's main thread may already have one running.
    async def discover_under_a_loop() -> str:
        return discover_model(server.url)

    with RawServer(llama_handler(NEVER)) as server, ThreadPoolExecutor(1) as own_thread:
        assert own_thread.submit(asyncio.run, discover_under_a_loop()).result() == MODEL
