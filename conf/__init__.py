"""Hydra configs of ddp-run, shipped inside the package as ``ddp_runner.conf`` (see pyproject.toml)."""
