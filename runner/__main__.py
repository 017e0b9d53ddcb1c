"""``python -m ddp_runner`` is ``ddp-run``."""

from ddp_runner.cli import main

main()
