"""``python -m runner`` is ``ddp-run``."""

from runner.cli import main

main()
