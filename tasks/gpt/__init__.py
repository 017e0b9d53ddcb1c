"""Task ``gpt``: a GPT-2-style language model, its fused loss and its token-stream data."""
