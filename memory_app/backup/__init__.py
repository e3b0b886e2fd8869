"""Backup and restore as JSON Lines, streamed in constant memory, imported idempotently.

Export (`export_lines`) yields one JSON object per line, referents before what refers to them:

    {"type": "header", "format": "agentmemory-backup", "version": 2, "embeddings": bool}
    {"type": "context", "digest", "keys", ...}              per context, then its
    {"type": "run", "ref", "context", ...}                  runs,
    {"type": "step", "run", "position", ..., "tool_calls": [...]}   steps with their tool calls,
    {"type": "message", "context", "seq", ..., "run", "step"}       messages,
    {"type": "memory", "ref", ...}                          memory records (context-scoped ones and
                                                            key-scoped ones the contexts fall under)
    {"type": "embedding", "item": "message"|"memory", ...}  vectors, when asked for
    {"type": "trailer", "counts": {kind: n}, "sha256": hex} last: the lines of each kind and the
                                                            digest of every byte before it

Rows are read with server-side cursors (`iterator(chunk_size=...)`), so memory does not grow with
the size of a context. References use natural keys, never the source's primary keys: a context
by its keys digest, a run by its client id (or its creation instant when it has none), a step by
(run, position), a message by (context, seq), a memory record by (scope digest, content hash).

Import (`import_lines`) reads the same lines in chunks and writes each chunk with bulk inserts,
all in one transaction: a file that fails half-way (a bad line, a context the key may not
write) leaves nothing behind, and so does one whose trailer is missing or does not match the
lines read (`lines`: a copy cut at a line boundary is well-formed line by line). A row whose
natural key is already stored is left as it is, so importing twice changes nothing.
Timestamps and agent-written values are restored verbatim; every value the server derives is
derived again, never taken from the file: keys and scope digests, content hashes, token counts,
vector dimensions, `recorded_by` (the importer), and the counters of every context and run the
import writes into (counted from their rows once the import is done; a merged context's
`last_seq` rises to the highest seq imported, so the agent's next append follows them).

A confined importer (an API key with context keys) writes only inside its keys: a context line
outside them is refused, and run, message and embedding lines reach only contexts the file itself
defines, so a digest of another tenant's context fails exactly like an unknown one.
"""
