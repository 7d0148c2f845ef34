"""Identifiers: DOI and arXiv id recognition, and the keys under which duplicates merge."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

_DOI_BODY = r"10\.\d{4,9}/\S+"
_DOI_FORMS = re.compile(rf"^(?:doi:\s*|https?://(?:dx\.)?doi\.org/|(?:dx\.)?doi\.org/)?({_DOI_BODY})$", re.IGNORECASE)
# new-style (2101.00001) and old-style (hep-th/9901001) arXiv ids; the version is not part of the paper
_ARXIV_ID = r"(\d{4}\.\d{4,5}|[a-z][a-z-]*(?:\.[a-z]{2})?/\d{7})(?:v\d+)?"
_ARXIV_FORMS = re.compile(
    rf"^(?:arxiv:\s*|https?://(?:www\.|export\.)?arxiv\.org/(?:abs|pdf)/|(?:https?://(?:dx\.)?doi\.org/)?"
    rf"10\.48550/arxiv\.){_ARXIV_ID}(?:\.pdf)?/?(?:[?#].*)?$",  # a query or fragment says nothing of the paper
    re.IGNORECASE,
)
_TRACKING_PARAMS = {
    "fbclid",
    "gclid",
    "dclid",
    "gbraid",
    "wbraid",
    "msclkid",
    "yclid",
    "mc_cid",
    "mc_eid",
    "igshid",
    "_ga",
    "_gl",
    "_hsenc",
    "_hsmi",
    "mkt_tok",
    "vero_id",
    "oly_anon_id",
    "oly_enc_id",
    "rb_clickid",
    "s_cid",
    "ref_src",
    "twclid",
    "ttclid",
    "srsltid",
}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def doi_of(identifier: str) -> str | None:
    """The bare DOI (`10.x/...`, lowercase) if `identifier` is a DOI in any common form."""
    match = _DOI_FORMS.match(identifier.strip())
    if not match:
        return None
    return match.group(1).rstrip(".,;").lower()


def arxiv_id_of(identifier: str) -> str | None:
    """The versionless arXiv id if `identifier` names one: `arXiv:2101.00001v2`, an
    arxiv.org/abs or /pdf URL, or arXiv's own DOI `10.48550/arXiv.2101.00001`."""
    match = _ARXIV_FORMS.match(identifier.strip())
    return match.group(1).lower() if match else None


def doi_url(doi: str) -> str:
    bare = doi_of(doi) or doi.strip()
    return f"https://doi.org/{bare}"


def split_url(text: str) -> SplitResult | None:
    """urllib's parts of `text`, or None where urllib refuses it: an unclosed IPv6 bracket
    (`http://[::1/`) raises, and from a client or an upstream it ended a socket or a task."""
    try:
        return urlsplit(text)
    except ValueError:
        return None


def is_url(identifier: str) -> bool:
    parts = split_url(identifier.strip())
    return parts is not None and parts.scheme.lower() in {"http", "https"} and bool(parts.netloc)


def canonical_url(url: str) -> str:
    """The URL without what does not name the page: case of scheme and host, `www.`, a default
    port, a trailing slash, tracking parameters, the order of the others, the fragment. A port
    that is no number, or out of range, leaves the URL as it is (urllib refuses to read it)."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return url.strip()
    if host.startswith("www."):
        host = host[4:]
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    query = ""
    if parts.query:  # most links have none: parsing and encoding an empty one took half the time
        kept = [
            (name, value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
            if not name.lower().startswith("utm_") and name.lower() not in _TRACKING_PARAMS
        ]
        query = urlencode(sorted(kept))
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), query, ""))


def canonical_key(href: str, kind: str | None = None) -> str:
    """One key per source: every DOI form collapses, every arXiv form too, URLs lose their noise,
    ids keep their kind."""
    arxiv = arxiv_id_of(href)
    if arxiv:
        return f"arxiv:{arxiv}"
    doi = doi_of(href)
    if doi:
        return f"doi:{doi}"
    if is_url(href):
        return canonical_url(href)
    return f"id:{kind}:{href.strip()}" if kind else f"id:{href.strip()}"


def identity_keys(href: str, metadata: Mapping[str, Any]) -> list[str]:
    """Every key one result is known by: its link's, and those of the DOI, arXiv id and PubMed id its
    metadata names. Two results sharing any key are one source (a preprint carrying its journal DOI
    is the published paper)."""
    keys = [canonical_key(href, metadata.get("type"))]
    for name in ("doi", "arxiv_id"):
        value = metadata.get(name)
        if isinstance(value, str) and value.strip():
            keys.append(canonical_key(value if name == "doi" or ":" in value else f"arxiv:{value}"))
    pmid = metadata.get("pmid")
    if isinstance(pmid, str | int) and str(pmid).strip().isdigit():
        keys.append(f"pmid:{str(pmid).strip()}")
    return [key for key in dict.fromkeys(keys) if key.startswith(("doi:", "arxiv:", "pmid:")) or key == keys[0]]


def string_ids(metadata: dict[str, Any]) -> dict[str, Any]:
    """`metadata` with every id (a key named `id` or ending in `_id`) as a string: ids that leave the
    server in JSON are strings (Dify's RetrievalSourceMetadata rejects an integer document_id)."""
    return {
        key: str(value) if _is_id(key) and isinstance(value, int | float) and not isinstance(value, bool) else value
        for key, value in metadata.items()
    }


def _is_id(key: str) -> bool:
    return key == "id" or key.endswith("_id")
