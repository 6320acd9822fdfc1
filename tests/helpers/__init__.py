"""Shared test helpers: datasets, toy environments and teachers, fast XLA
compilation, and the kill-and-resume driver of the CLI tests."""
