"""Configuration and planning: overrides, the validation table, the plan (pure), the memory plan, task-module checks,
the torch probe."""
