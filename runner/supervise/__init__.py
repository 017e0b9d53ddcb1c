"""One supervision session that every launcher uses: torchrun started and watched to its end (session.py,
supervisor.py), no process left behind (reaper.py, agent_dir.py), the driver's stop (stop/), the records written
whole at the end (finalize.py), and a node stopped by a signal still arriving at the agents' exit barrier
(exit_barrier.py)."""
