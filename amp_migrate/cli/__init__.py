"""The command line: options, which files a run reads, the worker pool, and what it prints."""
