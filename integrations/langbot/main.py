from __future__ import annotations

from langbot_plugin.api.definition.plugin import BasePlugin


class FedresearchPlugin(BasePlugin):
    """Holds the configuration; the KnowledgeEngine component does the work."""

    async def initialize(self) -> None:
        pass
