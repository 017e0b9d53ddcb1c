"""The launchers, behind one protocol (base.py) and one registry (registry.py): local, multinode, slurm (and its
sweeps), kubernetes (+ its manifests); torchrun's agent (agent.py) and the forkserver that starts its ranks
(forkserver.py). Every launcher runs torchrun through the one supervision session of runner/supervise/."""
