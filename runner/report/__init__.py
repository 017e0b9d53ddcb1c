"""Reports over run directories: the sweep summary and ddp-compare."""
