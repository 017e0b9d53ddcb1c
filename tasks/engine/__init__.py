"""The one training engine (worker side): set-up, loop, strategies, checkpoints, metrics, diagnostics."""
