"""URL normalisation: one spelling per page, for cache keys and offline look-ups."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_TRACKING_PREFIXES = ("utm_",)
_TRACKING_KEYS = frozenset({"fbclid", "gclid", "mc_cid", "mc_eid", "ref_src"})


def normalize_url(url: str) -> str:
    """Lowercase scheme and host, no default port, no fragment, no tracking parameters,
    canonical percent-encoding, no trailing slash (except the root). Never raises."""
    url = url.strip()
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").rstrip(".")
        port = parts.port
    except ValueError:
        return url
    netloc = host if port is None or _DEFAULT_PORTS.get(scheme) == port else f"{host}:{port}"
    path = quote(unquote(parts.path), safe="/_(),'-.~:@!$&+=;*") or "/"
    if len(path) > 1:
        path = path.rstrip("/") or "/"
    query = urlencode(
        [
            (k, v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if not k.startswith(_TRACKING_PREFIXES) and k not in _TRACKING_KEYS
        ]
    )
    return urlunsplit((scheme, netloc, path, query, ""))
