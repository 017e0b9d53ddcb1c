"""Diagnostics: the hang watchdog, other nodes' ranks, root cause, time breakdown, ddp-doctor."""
