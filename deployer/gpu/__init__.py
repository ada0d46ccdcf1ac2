"""The GPU domain: what may run on a GPU host and how to tell it does.

- ``matrix``: the compatibility matrix's data (``deployer/data/compat.yml``) and GPU names;
- ``version_plan``: a host's planned versions from its variables, ``upgrade-driver --to``;
- ``rules``: what a plan implies (``resolve``) and the rules it may break (``check``);
- ``verify``: a converged host's observed versions against its resolved plan;
- ``gpu_plan``: the ``gpu_plan`` variable the GPU roles read (packages, switch, repository);
- ``preflight``: the GPU preflight of ``up`` and ``check`` (the matrix, a loaded driver);
- ``dcgmi``: verdicts of ``dcgmi health`` and ``dcgmi diag`` output;
- ``driver_record``: the driver a completed ``upgrade-driver`` run records on the host.

``deployer/dcgm_fields.py`` (the exporter's field lists) joins this package later.
"""
