"""The benchmark behind `manage.py benchmark`: a synthetic dataset in its own database, the
measurements (through the HTTP API and the dashboard, in-process WSGI), a naive in-process
baseline doing the same work, and the Markdown report (`docs/benchmarks.md`).

- `database`  create / drop / switch to the benchmark database;
- `dataset`   build the dataset with COPY (sizes from `Sizes`);
- `baseline`  the naive in-process memory the figures are compared with;
- `measure`   timing helpers, result rows, targets and the report.
"""
