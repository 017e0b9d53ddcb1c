"""``python -m ddp_runner.data.tokenize``: the same as ``ddp-tokenize``."""

import sys

from ddp_runner.data.tokenize.cli import main

if __name__ == "__main__":  # imported (the import-graph test imports every module), it runs nothing
    sys.exit(main())
