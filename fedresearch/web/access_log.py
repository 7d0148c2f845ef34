"""aiohttp's access log with secrets taken out: `GET /ws?token=KEY` is logged as `?token=REDACTED`."""

from __future__ import annotations

import re
from collections.abc import Iterable

from aiohttp.web_log import AccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from fedresearch.core.secrets import CREDENTIAL_NAME

# a query parameter whose name says it carries a credential (token, key, api_key, x-api-key, secret...)
_SECRET_PARAMETER = re.compile(
    r"(?P<name>[?&;](?:[^=&;\s\"]*?)" + CREDENTIAL_NAME + r"[^=&;\s\"]*=)[^&;\s\"]*", re.IGNORECASE
)


def redact(text: str) -> str:
    """`text` with the value of every credential-looking query parameter replaced by REDACTED."""
    return _SECRET_PARAMETER.sub(r"\g<name>REDACTED", text)


class RedactingAccessLogger(AccessLogger):
    """The standard format and fields (request line, Referer...), every value passed through `redact`."""

    def _format_line(
        self, request: BaseRequest, response: StreamResponse, time: float
    ) -> Iterable[tuple[str | tuple[str, str], str]]:
        line = super()._format_line(request, response, time)
        return [(key, redact(value) if isinstance(value, str) else value) for key, value in line]
