"""What a run tells about itself: heartbeat, fault injection for tests, GPU telemetry, profiling."""
