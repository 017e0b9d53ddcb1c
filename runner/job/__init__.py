"""One job of ``ddp-run``, between the CLI and the launchers: plan it (refusing bad input before anything starts),
open its run directory through its launcher, record what will run, launch. Hydra-free: the CLI hands it the
composed config and how the job was asked for."""
