"""What a run tells about itself: fault injection for tests, termination, GPU telemetry, profiling."""
