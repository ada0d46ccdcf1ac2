"""SIMULATED NVIDIA programs (Python 3 stdlib only) that the simulated packages install."""
