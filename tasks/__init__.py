"""Worker side: the tasks (smoke, gpt) and the one training engine (engine/) that every task runs on."""
