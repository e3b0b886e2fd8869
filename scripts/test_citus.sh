#!/usr/bin/env bash
# The suites that reach the database through the product's own paths (API and its request path,
# MCP, OTLP and its span queue, workers, curation, search, purge, a context's history page), run
# against a Citus coordinator with two workers: the cluster is started from the build
# scripts/build_citus.sh made, migrated and distributed as an operator would (`manage.py
# migrate`, `manage.py distribute`), and stopped at the end.
#
#   scripts/test_citus.sh [CITUS_TREE] [pytest arguments...]
set -euo pipefail

tree=${1:-var/citus-pg}
shift || true
python=${PYTHON:-.venv/bin/python}
if [ ! -f "$tree/lib/postgresql/citus.so" ]; then
    echo "no Citus build in $tree: scripts/build_citus.sh SOURCE_DIR $tree makes one" >&2
    exit 1
fi
data=var/citus-data
database=test_agentmemory_citus
# A fresh cluster each run: the suite's database is made, migrated and distributed anew.
if [ -f "$data/ports" ]; then "$python" scripts/citus_cluster.py stop "$data" || true; fi
rm -rf "$data"
"$python" scripts/citus_cluster.py start "$tree" "$data" --database "$database" >/dev/null
trap '"$python" scripts/citus_cluster.py stop "$data"' EXIT
export DATABASE_URL
DATABASE_URL=$("$python" scripts/citus_cluster.py url "$data" --database "$database")
"$python" manage.py migrate --no-input -v 0
"$python" manage.py distribute
# The test database is the cluster's own (made and distributed above), kept as it is.
AGENTMEMORY_TEST_DB_NAME=$database AGENTMEMORY_CITUS_TREE="$tree" "$python" -m pytest --reuse-db \
    -m "not browser" -p no:cacheprovider \
    tests/test_api_*.py tests/test_mcp*.py tests/test_otel_*.py tests/test_embeddings.py \
    tests/test_deferred_index.py tests/test_curation.py tests/test_memories.py \
    tests/test_memory_review.py tests/test_search.py tests/test_selectors.py \
    tests/test_client_live.py tests/test_memory_history.py tests/test_retention.py \
    tests/test_erasure.py tests/test_scores.py tests/test_langgraph_store.py \
    tests/test_langgraph_checkpoint.py tests/test_citus_cluster.py tests/test_global_search.py \
    tests/test_request_path.py tests/test_otlp_queue.py tests/test_purge_total.py \
    tests/test_fulltext.py tests/test_batch_vectors.py tests/test_context_history.py \
    tests/test_shard_reads.py tests/test_direct_answers.py "$@"
