"""The memory index on PostgreSQL + pgvector, for several gateway nodes sharing one database.

Importing this package imports psycopg (the ``postgres`` extra); the default install, on
SQLite, never does. Modules:

* :mod:`memory.pg.migrations` — schema, recorded migrations under an advisory lock;
* :mod:`memory.pg.indexer` — chunking of ``recalld_messages`` claimed per session
  (``FOR UPDATE SKIP LOCKED``), embedding each distinct text once across nodes;
* :mod:`memory.pg.vectors` — the vector leg's index, made once the embedder's width is known;
* :mod:`memory.pg.search` — keyword (BM25), vector and hybrid in one statement;
* :mod:`memory.pg.contract` — the sessions tables as read here, and a stand-in writer for tests.
"""
