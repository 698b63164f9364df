"""recalld test suite."""
