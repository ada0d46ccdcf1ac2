"""Rolling NVIDIA driver upgrades (``gpumon-deploy upgrade-driver``): a per-host state machine on
bare metal, modelled on the GPU Operator's upgrade controller (NVIDIA k8s-operator-libs
``pkg/upgrade``: upgrade-required -> cordon -> wait-for-jobs -> drain -> validation -> uncordon ->
done, a failed state, and a node's pre-existing cordon remembered so it is never lifted), with
Alertmanager silences, a canary, max-unavailable that counts hosts already down or drained,
max-failures over the whole run, and resume from a crash.

Modules: ``options`` (the run's choices, persisted as given), ``state`` (steps, the persisted
record, atomic writes), ``batching`` (canary, batches,
max-unavailable / max-failures arithmetic), ``drain`` (Slurm, Kubernetes, command hooks),
``silences`` (Alertmanager API v2), ``hostops`` (on-host shell: jobs, stop, reload, probe),
``host_targets`` (the target on every host, checked against the matrix), ``monitoring`` (Alertmanager peers and
Prometheus replicas from the inventory), ``validation``, ``controller`` (the run), ``view`` (live
table, plan text, JSON report), ``command`` (the CLI entry).

Public API: ``upgrade_driver(UpgradeRequest) -> exit status`` (``deployer.rollout.command``),
the run's choices in ``RolloutOptions`` (``deployer.rollout.options``). Importing the package
imports none of its modules (the CLI reads the options' defaults without the rest).
"""
