"""``python -m ddp_runner.diagnostics.doctor``: the same as ``ddp-doctor``."""

from ddp_runner.diagnostics.doctor.cli import main

if __name__ == "__main__":  # imported (the import-graph test imports every module), it runs nothing
    raise SystemExit(main())
