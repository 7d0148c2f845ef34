"""Job notifications: a finished or failed job is POSTed to WEBHOOK_URL, retried with exponential
backoff, in the background: a receiver that is down never delays or fails the job.

WEBHOOK_URL is the operator's configuration, not a user's input, so it is not held to the SSRF rules
for the pages a task reads (it is often a service on the operator's own network)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from fedresearch.core.settings import Settings, secret
from fedresearch.jobs.store import Job, JobStatus

log = logging.getLogger("fedresearch")

_TIMEOUT = aiohttp.ClientTimeout(total=15, connect=5)


def payload(job: Job, report: str | None) -> dict[str, Any]:
    """`{research_id, status, user_id, data | error, timestamp}`: `data` for a completed job (its
    question, report type, Markdown report and files), `error` for a failed one."""
    body: dict[str, Any] = {"research_id": job.research_id, "status": job.status.value, "user_id": job.owner}
    if job.status is JobStatus.completed:
        body["data"] = {"task": job.task, "report_type": job.report_type, "report": report, "files": job.files}
    else:
        body["error"] = job.error or "the job failed"
    body["timestamp"] = datetime.now(UTC).isoformat()
    return body


async def notify(session: aiohttp.ClientSession, settings: Settings, body: dict[str, Any]) -> bool:
    """POST `body` to WEBHOOK_URL until a 2xx answer, at most WEBHOOK_ATTEMPTS times, waiting
    WEBHOOK_BACKOFF_S, then twice as long, and so on between attempts; whether it was delivered."""
    url = settings.webhook_url
    if not url:
        return False
    key = secret(settings.webhook_api_key)
    headers = {"x-api-key": key} if key else {}
    where = urlsplit(url).netloc.rpartition("@")[2]  # never the URL's query or user info: they may hold secrets
    research_id = body.get("research_id")
    for attempt in range(1, settings.webhook_attempts + 1):
        try:
            # never follows a redirect: the key, and on a 307 the whole report, would go to the new address
            post = session.post(url, json=body, headers=headers, timeout=_TIMEOUT, allow_redirects=False)
            async with post as response:
                if 200 <= response.status < 300:
                    return True
                reason = f"HTTP {response.status}"
                if 300 <= response.status < 400:
                    reason += " (a redirect, not followed: set WEBHOOK_URL to where it points)"
        except (aiohttp.ClientError, TimeoutError) as error:
            reason = type(error).__name__
        if attempt == settings.webhook_attempts:
            log.warning("webhook for job %s to %s failed %d times (%s); giving up", research_id, where, attempt, reason)
            return False
        delay = settings.webhook_backoff_s * 2 ** (attempt - 1)
        log.info(
            "webhook for job %s to %s: attempt %d failed (%s), retrying in %.1f s",
            research_id,
            where,
            attempt,
            reason,
            delay,
        )
        await asyncio.sleep(delay)
    return False
