"""torchrun's agent with its TCPStore servers bound to their host's address: ``python -m ddp_runner.launch.agent
<torchrun arguments>``.

The same program as ``python -m torch.distributed.run`` (every option is torchrun's own); only the stores it
creates listen on one address instead of every interface (``runner/contract/netbind.py``).
"""

from __future__ import annotations

from ddp_runner.contract import netbind


def main() -> None:
    """Bind the stores, then hand over to torchrun's own main (it reads ``sys.argv``)."""
    netbind.install()
    from torch.distributed.run import main as torchrun_main

    torchrun_main()


if __name__ == "__main__":
    main()
