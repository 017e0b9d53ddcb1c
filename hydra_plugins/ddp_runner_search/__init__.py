"""ddp-runner's search sweeper as a Hydra plugin: ``hydra/sweeper=ddp_search`` (runner/job/search_sweeper.py)."""
