"""gpumon-deploy: deployment and HA orchestration of the GPU-cluster monitoring stack."""

__version__ = "0.1.0"
