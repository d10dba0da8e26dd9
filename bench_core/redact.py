"""Credentials kept out of everything recorded or shown: user-info in URLs, secret-looking keys anywhere.

A server's URL may carry `user:password@`, an extra request body an `api_key`, a server's error text
an `Authorization` header. Requests are sent with the real values; every record (history.csv,
config.json, environment.json, requests.parquet, the user's CSVs), every message printed or shown,
and every dashboard view gets them through here first. A key is secret-looking when its words
(split at `_`, `-`, `.` and camelCase) name a credential: `api_key`, `X-Api-Key`, `accessToken`,
`password`, `sessionid`, `auth_header`... (`max_tokens`, `tokenizer`, `stop_token_ids` and `session_len` are not).
"""

from __future__ import annotations

import functools
import json
import re
import urllib.parse
from typing import Any

MASK = "***"
# Words that name a credential wherever they stand, or begin a word that does (`sessionid`, `client_secrets`,
# `cookies`); words that do at the end of a key (`access_token` and `key` are secrets, `stop_token_ids` and
# `key_count` are not); and the session, which is one when it names an identity, not a length (`session_id`,
# `session_token`, but `session_len`).
_SECRET_STEMS = (
    "apikey",
    "secret",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "authoriz",
    "auth",
    "credential",
    "cookie",
    "bearer",
    "sessionid",
    "sessiontoken",
    "sessionkey",
)
_SECRET_LAST_WORDS = frozenset({"key", "token", "signature", "session", "sid"})
_SESSION_SECRETS = frozenset({"id", "key", "token", "cookie"})
_PAIR_MARKS = frozenset("@=:")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD_SEPARATORS = re.compile(r"[^a-z0-9]+")
# scheme://user:password@ (up to the last '@' of the authority)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@'\"]*(?:@[^\s/?#@'\"]*)*@")
# name=value in a query string or a form body
_QUERY_PAIR = re.compile(r"(?<=[?&;])([^=&#\s'\"]+)=([^&#\s'\"]*)")
# "name": value in JSON or 'name': value in a Python repr, when the text is not JSON as a whole
_QUOTED_PAIR = re.compile(r"""(["'])([^"'\s]+)\1(\s*:\s*)("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^,}\]\s]+)""")
_HEADER_PAIR = re.compile(r"(?i)\b(authorization|x-api-key|api-key|cookie)(\s*[:=]\s*)(bearer\s+|basic\s+)?[^\s,;'\"]+")
# A bearer token quoted without its header's name ("Invalid header value b'Bearer sk-...'"): a word of 8 or more
# characters, a digit or a token's punctuation among them, so "a bearer of news" is left alone.
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?=[\w.~+/=-]*[\d_.~+/=-])[\w.~+/=-]{8,}")


# Credentials this process was given (`remember_secrets`): masked wherever they appear, in whatever words
# a server's error quotes them. Short values are left to the patterns: masking them everywhere would
# mangle ordinary text.
_KNOWN: set[str] = set()
MIN_KNOWN_CHARS = 6


def remember_secrets(url: str = "", request_body: str = "", api_key: str | None = None) -> None:
    """Note the credentials a run is about to send: the URL's user-info (user names too: some servers take a
    token there), the values under secret-looking keys of the request body (JSON text), the API key."""
    found = [api_key or ""]
    try:
        address = urllib.parse.urlsplit(url.strip())
        user_info = [address.username or "", address.password or ""]
    except ValueError:  # not a URL: the run's validation says so
        user_info = []
    found += [text for part in user_info for text in (part, urllib.parse.unquote(part))]
    try:
        found += _secret_values(json.loads(request_body))
    except ValueError:
        pass
    _KNOWN.update(form for value in found for form in _quoted_forms(value) if len(form) >= MIN_KNOWN_CHARS)


def _quoted_forms(secret: str) -> set[str]:
    """`secret` as a message may quote it: as it is, escaped as Python's repr and JSON write it, and each of its
    lines (a key pasted with a line break is split there by whatever reads it as a header)."""
    return {
        secret,
        secret.encode("unicode_escape").decode("ascii"),
        json.dumps(secret)[1:-1],
        *(line.strip() for line in secret.splitlines()),
    }


@functools.lru_cache(maxsize=4096)  # the same few hundred column names, row after row
def is_secret_key(name: Any) -> bool:
    """Whether a mapping key or field name looks like it holds a credential."""
    words = [word for word in _WORD_SEPARATORS.split(_CAMEL.sub(r"\1_\2", str(name)).lower()) if word]
    pairs = list(zip(words, words[1:]))
    return (
        any(word.startswith(_SECRET_STEMS) and not _is_author(word) for word in words)
        or ("api", "key") in pairs
        or any(first == "session" and second in _SESSION_SECRETS for first, second in pairs)
        or bool(words)
        and words[-1] in _SECRET_LAST_WORDS
    )


def _is_author(word: str) -> bool:
    """An author, not an authorization: begins with "auth" without naming a credential."""
    return word.startswith("author") and not word.startswith("authoriz")


def redact(value: Any) -> Any:
    """`value` with every credential removed: mappings lose their secret-looking keys (at any depth),
    text has its URL user-info and secret values masked; other values are returned as they are."""
    if isinstance(value, dict):
        return {key: redact(item) for key, item in value.items() if not is_secret_key(key)}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(item) for item in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """Text as it may be shown: JSON text keeps its shape with secret values masked; in any other text,
    URL user-info, `name=value` / `"name": value` pairs with secret names, auth headers and bearer tokens are
    masked."""
    for secret in sorted(_KNOWN, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)
    if not _PAIR_MARKS.intersection(text):  # no URL user-info, no name=value, no name: value
        return text
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            parsed = json.loads(stripped)
        except ValueError:
            pass
        else:
            masked = _masked(parsed)
            return text if masked == parsed else json.dumps(masked)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _QUERY_PAIR.sub(lambda m: f"{m.group(1)}={MASK}" if is_secret_key(m.group(1)) else m.group(0), text)
    text = _QUOTED_PAIR.sub(_masked_pair, text)
    return _HEADER_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3) or ''}{MASK}", text)


def _masked(value: Any) -> Any:
    """A parsed JSON value with the values of secret-looking keys replaced by the mask, so the shape stays visible."""
    if isinstance(value, dict):
        return {key: MASK if is_secret_key(key) else _masked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_masked(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _secret_values(value: Any, secret: bool = False) -> list[str]:
    """The text of every leaf under a secret-looking key of a parsed JSON value."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in _secret_values(item, secret or is_secret_key(key))]
    if isinstance(value, list):
        return [text for item in value for text in _secret_values(item, secret)]
    return [str(value)] if secret and value is not None else []


def _masked_pair(match: re.Match) -> str:
    quote, name, colon, _ = match.groups()
    if not is_secret_key(name):
        return match.group(0)
    return f"{quote}{name}{quote}{colon}{quote}{MASK}{quote}"
