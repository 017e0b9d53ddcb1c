"""The contract between the driver (runner/) and the workers (tasks/): run-tree and environment names, errors, key rules, corpus format, atomic writes, checkpoint integrity. Standard library only."""
