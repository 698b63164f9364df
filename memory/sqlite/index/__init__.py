"""Keeping the index: the SQLite schema and its migrations, files → chunks, vectors and their cache,
the in-memory KNN pre-filter, the debounce/watch scheduler."""
