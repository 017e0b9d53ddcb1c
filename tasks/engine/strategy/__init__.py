"""Parallel strategies: how the engine wraps the model, synchronises gradients and checkpoints its state."""
