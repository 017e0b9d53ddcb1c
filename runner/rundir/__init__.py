"""The run directory: creating and opening it, its lease, its manifest, and a run's status."""
