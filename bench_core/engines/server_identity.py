"""What an OpenAI-compatible server says it is, from its GET /v1/models answer and its `Server` header: the models
it serves and its kind (openai_request.SERVER_KINDS), for a run whose server kind is left to "auto". The kind decides
how ignore_eos and the sampling fields are sent and which /metrics names are read, so a server left to the default
is asked as it takes it.

The signs, first match wins: a model's `owned_by` naming the kind (vLLM, SGLang and LMDeploy write their own name
there); a `Server` header naming it; `transformers serve`'s models, which carry a load `status` object no other
server sends. llama.cpp (`owned_by` "llamacpp", `Server: llama.cpp`) is named in the note but has no kind of its
own: it is asked as any OpenAI server is. Anything else is "openai", said so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .http_route import DEFAULT_POLICY, NetworkPolicy
from .http_stream import HTTPStreamError, failure_sentence, fetch, status_sentence
from .openai_client import ServerError, auth_headers
from .openai_request import GENERIC_KIND, SERVER_KINDS, api_root

_NAMED_KINDS = tuple(kind for kind in SERVER_KINDS if kind != GENERIC_KIND)
_LLAMA_CPP_SIGNS = ("llamacpp", "llama.cpp")


@dataclass(frozen=True)
class ServerIdentity:
    models: list[str]  # the ids GET /v1/models lists, in its order
    kind: str  # one of SERVER_KINDS
    evidence: str  # what said so ("" when nothing did: the generic kind)
    software: str = ""  # what it runs where it has no kind of its own (llama.cpp)

    @property
    def note(self) -> str:
        """The run's note on its kind: detected, and from what."""
        if self.evidence:
            return f"server kind: {self.kind}, detected from {self.evidence}"
        if self.software:
            return f"server kind: {self.kind} ({self.software}, which has no kind of its own)"
        return f"server kind: {self.kind}: neither /v1/models nor the Server header says which server it is"


def identity_from_answer(listing: object, server_header: str) -> ServerIdentity:
    """The identity a /v1/models answer (parsed JSON) and a `Server` header ("" when none) give. Pure."""
    entries = listing.get("data") if isinstance(listing, dict) else None
    entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    models = [str(e["id"]) for e in entries if "id" in e]
    owners = [str(e.get("owned_by") or "").strip() for e in entries]
    header = server_header.strip()
    for owner in owners:
        if owner.lower() in _NAMED_KINDS:
            return ServerIdentity(models, owner.lower(), f'/v1/models (owned_by "{owner}")')
    for kind in _NAMED_KINDS:
        if kind in header.lower():
            return ServerIdentity(models, kind, f'the Server header ("{header}")')
    if any(isinstance(e.get("status"), dict) and "value" in e["status"] for e in entries):
        return ServerIdentity(models, "transformers", "/v1/models (transformers serve's model load status)")
    if any(owner.lower() in _LLAMA_CPP_SIGNS for owner in owners) or header.lower().startswith("llama.cpp"):
        return ServerIdentity(models, GENERIC_KIND, "", "llama.cpp")
    return ServerIdentity(models, GENERIC_KIND, "")


def identify_server(
    base_url: str, api_key: str | None = None, network: NetworkPolicy = DEFAULT_POLICY, timeout_s: float = 10.0
) -> ServerIdentity:
    """Ask the server at `base_url` what it is (GET /v1/models, with the run's credentials); ServerError, in one
    sentence, where it cannot be asked."""
    url = api_root(base_url) + "/v1/models"
    try:
        response = fetch(url, auth_headers(api_key, url), network, timeout_s)
    except HTTPStreamError as exc:
        raise ServerError(failure_sentence(url, exc)) from None
    if response.status != 200:
        raise ServerError(status_sentence(url, response))
    try:
        listing = json.loads(response.body)
    except ValueError:
        raise ServerError(f"{url} did not answer with JSON: is this an OpenAI-compatible server?") from None
    return identity_from_answer(listing, response.headers.get("server", ""))
