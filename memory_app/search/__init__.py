"""Search within one context: `messages` ranks a context's messages by keyword (PostgreSQL
full-text), by meaning (pgvector) or both fused; `fulltext` keeps the messages' full-text vectors
that keyword search reads, written off the write path by the indexer."""
