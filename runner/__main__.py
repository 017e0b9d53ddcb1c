"""``python -m ddp_runner`` is ``ddp-run``."""

from ddp_runner.supervise.stop import early

early.note()  # first: a stop while the CLI loads is one line, no traceback (runner/supervise/stop/early.py)

from ddp_runner.cli import main  # noqa: E402

main()
