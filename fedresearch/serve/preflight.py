"""What a server process sets up before it listens: the log's format, the refusal to listen beyond
this machine without API keys, and where its data is."""

from __future__ import annotations

import logging

from fedresearch.core.auth import ApiKeys, check_bind
from fedresearch.core.settings import Settings
from fedresearch.report.fonts import MISSING_CJK_FONT, cjk_font_installed

log = logging.getLogger("fedresearch")


def prepare(settings: Settings, host: str, with_pid: bool, warn: bool = True) -> None:
    """The log's format, and the refusal to listen beyond this machine without API keys."""
    process = "[%(process)d]" if with_pid else ""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s %(name)s{process}: %(message)s")
    keys = ApiKeys.from_settings(settings)
    refusal = check_bind(host, keys)
    if refusal:
        raise SystemExit(refusal)
    if not warn:  # a worker: its supervisor said all this
        return
    if not keys.enabled:
        log.warning("no API keys configured (FEDRESEARCH_API_KEYS): listening on %s only", host)
    log.info("library: %s; data (jobs, reports): %s", settings.library_display, settings.data_dir)
    if hint := settings.left_behind():
        log.warning("%s", hint)
    if not cjk_font_installed():
        log.warning("%s", MISSING_CJK_FONT)
