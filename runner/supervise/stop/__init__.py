"""The driver's stop (Ctrl-C, SIGTERM, SIGHUP, the pre-emption signal), from its first line to its last:

0. While the CLI's modules load, before its main runs: early.py notes the signal; guard.py takes it as main starts.
1. Before anything is launched (the CLI's entry, planning, the run directory being made): guard.py. The handlers
   come first thing (:func:`guard.guarded`); a stop ends in one line and exit 128 + the signal, or is noted while a
   run directory is made or recorded (:func:`guard.deferred`) and taken by the job or the supervisor
   (:func:`guard.take`).
2. While torchrun runs: forward.py (the supervisor installs its handler). The first signal asks the ranks to save
   and stop (SIGTERM to torchrun, or the stop-request file), a second one stops everything at once; a stop noted
   as the launch was recorded means torchrun never starts.
3. After torchrun ends: outcome.py says what the stop did (read from the ranks' records), and
   runner/supervise/finalize.py records and prints it.

The ranks' side of a stop is the workers' own (tasks/engine/); a sweep's and a followed Slurm job's handlers are in
runner/job/pool.py and runner/launch/slurm.py / slurm_sweep.py; a sequential sweep ends on the first stop signal the
driver took (:func:`guard.received`, runner/job/sweeping.py)."""
