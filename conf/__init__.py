"""Hydra configs of ddp-run, shipped inside the package as ``ddp_runner_conf`` (see pyproject.toml)."""
