"""The monitoring tier's own Python: ``status`` and its checks (the running stack through its APIs,
Slurm's view of the GPU nodes, the long-term store), what the Prometheus role renders (``file_sd``
targets, ``remote_write``) and pushes (``targets``), the tier as an upgrade sees it (``tier``,
``silences``), the one HTTP client (``http``) and the Grafana dashboards (``dashboards/``).
Each module's layer: docs/architecture.md."""
