"""What a rank reports while it trains: the log window's gathered values and their trackers' scalars, the step
meter and the task's extra metrics, rank 0's console progress, and the run summary."""
