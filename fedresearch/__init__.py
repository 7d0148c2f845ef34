"""fedresearch: one cited research report from your own library and the web, searched at once.

Floors, each importing only those below it: `cli`; `web` (transport); `report` and `knowledge`;
`federation` and `retrievers`; `library`; `core`. docs/architecture.md walks through them.
"""

__version__ = "0.1.0"
