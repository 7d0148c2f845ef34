"""The library: a user's own documents, stored (embedded, or on PostgreSQL), indexed and searched
per user with BM25 and embeddings fused."""
