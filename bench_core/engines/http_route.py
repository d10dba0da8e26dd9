"""Where a request goes and whom it trusts: the server's origin, the proxy the environment names for it (as curl and
Go read `http_proxy`, `https_proxy`, `all_proxy` and `no_proxy`, either case, lower case first; loopback always
direct), and the TLS context (the system's store, a CA bundle, or unverified when asked). One `NetworkPolicy`
holds a run's choices; `http_stream` applies it to every request, streams and GETs alike.
"""

from __future__ import annotations

import base64
import ipaddress
import ssl
import urllib.parse
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True)
class NetworkPolicy:
    """How every request of a run reaches its server."""

    proxy_env: bool = True  # proxies from the environment; False: always direct
    ca_bundle: str = ""  # a PEM file of the certificate authorities to trust instead of the system's
    insecure: bool = False  # no certificate verification

    def ssl_context(self) -> ssl.SSLContext:
        return _ssl_context(self.ca_bundle, self.insecure)

    def proxy_for(self, origin: Origin) -> Origin | None:
        """The forward proxy for `origin`, or None to go direct; ValueError for a proxy setting it cannot use."""
        if not self.proxy_env or _is_loopback(origin.host):
            return None
        proxies = urllib.request.getproxies_environment()  # lower case first; HTTP_PROXY ignored under CGI
        if _bypassed(origin, proxies.get("no", "")):
            return None
        url = proxies.get(origin.scheme) or proxies.get("all")
        if not url:
            return None
        proxy = Origin(url if "://" in url else f"http://{url}")
        if proxy.scheme != "http" or not proxy.host:
            raise ValueError(f"the proxy {proxy.shown} is not an http:// proxy, the only kind this client uses")
        return proxy


DEFAULT_POLICY = NetworkPolicy()


def _ssl_context(ca_bundle: str, insecure: bool) -> ssl.SSLContext:
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=ca_bundle or None)  # OSError, ssl.SSLError: the bundle is unreadable


def _bypassed(origin: Origin, no_proxy: str) -> bool:
    """Whether no_proxy names the host, as curl reads it: `*`, or names (a leading dot or `*.` optional) that
    match the host or a domain above it, each with a port that must match too where one is given."""
    host = origin.host.lower()
    for entry in no_proxy.lower().split(","):
        name, _, port = entry.strip().removeprefix("*.").lstrip(".").partition(":")
        if name == "*":
            return True
        if name and (host == name or host.endswith("." + name)) and (not port or port == str(origin.port)):
            return True
    return False


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Origin:
    """Where one server (or proxy) is, as the request line and the connection need it."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.scheme = parts.scheme
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        default_port = self.port == (443 if self.https else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.authority = f"{host}:{self.port}"
        self.shown = f"{self.scheme}://{self.authority}"  # without user-info: fit for a message
        self.user = urllib.parse.unquote(parts.username) if parts.username else None
        self.password = urllib.parse.unquote(parts.password or "")

    def same(self, other: Origin) -> bool:
        return (self.scheme, self.host.lower(), self.port) == (other.scheme, other.host.lower(), other.port)


def basic_auth(user: str, password: str) -> str:
    """The Authorization value for a URL's user-info (latin-1, as aiohttp and urllib send it)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode("latin-1")).decode()


def target_of(url: str) -> str:
    """The request line's target of a URL: its path and query."""
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
