"""Backup and restore as JSON Lines, streamed in constant memory, imported idempotently.

Export (`export_lines`) yields one JSON object per line, referents before what refers to them:

    {"type": "header", "format": "agentmemory-backup", "version": 3, "embeddings": bool}
    {"type": "context", "digest", "keys", ...}              per context, then its
    {"type": "run", "ref", "context", ...}                  runs,
    {"type": "step", "run", "position", ..., "tool_calls": [...]}   steps with their tool calls,
    {"type": "message", "context", "seq", ..., "run", "step"}       messages,
    {"type": "score"|"label"|"comment", "context", ..., "run"|"step"|"message"}  what reviewers
                                                            and evaluators wrote on them,
    {"type": "checkpoint", "context", ..., "run"}           LangGraph checkpoints, then their
    {"type": "checkpoint_blob"|"checkpoint_write", "context", ...}  channel values and writes,
    {"type": "memory", "ref", ...}                          memory records (context-scoped ones and
                                                            key-scoped ones the contexts fall under)
    {"type": "memory_version", "scope_digest", "content_hash", "version", ...}  their versions
                                                            (the operator's and an admin key's
                                                            export only),
    {"type": "embedding", "item": "message"|"memory", ...}  vectors, when asked for
    {"type": "trailer", "counts": {kind: n}, "sha256": hex} last: the lines of each kind and the
                                                            digest of every byte before it

Rows are read with server-side cursors (`iterator(chunk_size=...)`), so memory does not grow with
the size of a context. References use natural keys, never the source's primary keys: a context
by its keys digest, a run by its client id (or its creation instant when it has none), a step by
(run, position), a message by (context, seq), a memory record by (scope digest, content hash).
Scores, labels, comments and checkpoints belong to a context and are exported with it; memory
versions go with their memory. A memory's versions hold its past content and notes, which an
operator may have edited out of it (personal data, say): `manage.py export_memory` and an API
key with the admin scope export them, a read key's export holds no version line (it sees each
memory as it stands, as the API shows it). No export writes a version's `actor`. A score,
label or comment names exactly one target (a run, a step, or a message by its seq in the
line's context). The natural keys of those rows (a score or comment line needs its
`created_at`):

    score                (context, target, name, created_at)
    label                (context, target, name)            the table's unique key
    comment              (context, target, created_at)
    checkpoint           (context, namespace, checkpoint id)
    checkpoint_blob      (context, namespace, channel, version)
    checkpoint_write     (context, namespace, checkpoint id, task id, index)
    memory_version       (memory, version)

A saver's bytes travel as base64 text. Version 2 files (the first six kinds) still import.

Import (`import_lines`) reads the same lines in chunks and writes each chunk with bulk inserts,
all in one transaction: a file that fails half-way (a bad line, a context the key may not
write) leaves nothing behind, and so does one whose trailer is missing or does not match the
lines read (`lines`: a copy cut at a line boundary is well-formed line by line). A row whose
natural key is already stored is left as it is, so importing twice changes nothing.
Timestamps and agent-written values are restored verbatim; every value the server derives is
derived again, never taken from the file: keys and scope digests, content hashes, token counts,
vector dimensions, `recorded_by`, a score's, label's or comment's `author` and a memory
version's `actor` (each the importer: who wrote them on the source server is the file's word,
and its users and keys are not in a backup; a line may omit them), the run of an annotation
on a step or message (its target's run), and the counters of every context and run the
import writes into (counted from their rows once the import is done; a merged context's
`last_seq` rises to the highest seq imported, so the agent's next append follows them).

Versions attach only to a memory the import creates (a memory stored already keeps its own
history), and each created memory then gets one more, `import`. Checkpoints are stored as rows,
not put again: the runs and steps they made are lines of their own.

A confined importer (an API key with context keys) writes only inside its keys: a context line
outside them is refused, and run, message, annotation, checkpoint and embedding lines reach only
contexts the file itself defines (their runs, steps and messages only in that context), and
memory version lines only memories its memory lines resolved to, so a digest of another tenant's
context, a ref of its run or the hash of its memory fails exactly like an unknown one.
"""
