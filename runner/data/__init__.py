"""Data preparation on the driver side: the corpus, data checks before launch, the tokenizer (ddp-tokenize)."""
