"""Launching and supervising: one Launcher protocol and registry (local, multinode, slurm), one supervision session
that every launcher uses, finalisation."""
