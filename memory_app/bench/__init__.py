"""The benchmark behind `manage.py benchmark`: a synthetic dataset in its own database, the
measurements (through the HTTP API and the dashboard, in-process WSGI), a naive in-process
baseline doing the same work, and the Markdown report (`docs/benchmarks.md`).

- `database`  create / drop / switch to the benchmark database;
- `dataset`   the dataset's sizes, texts and vectors (`Sizes`, `Generator`, `Dataset`);
- `load`      load it with COPY (`columns`: the columns each COPY writes);
- `baseline`  the naive in-process memory the figures are compared with;
- `measure`   timing helpers, result rows, targets and the report;
- `harness`   what every area shares: `Bench`, `BenchError`, the sizes read with;
- the areas, one module each: `startup`, `selectors`, `recall`, `transcript`, `export`,
  `dashboard`, `storage`, `ingest` (last: it writes), `peers` (with `--peers`) and
  `peers_http` (with `--only peers_http`: the peers behind `peer_handlers`, served from the
  venv `make peers-venv` builds).
"""
