"""The embedded local library: store of record, full-text index, ingest and per-user search."""
