"""``python -m ddp_runner.diagnostics.doctor``: the same as ``ddp-doctor``."""

from ddp_runner.diagnostics.doctor.cli import main

raise SystemExit(main())
