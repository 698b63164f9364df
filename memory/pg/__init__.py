"""The memory index on PostgreSQL + pgvector, for several gateway nodes sharing one database.

Importing this package imports psycopg (the ``postgres`` extra); the default install, on
SQLite, never does. Modules:

* :mod:`memory.pg.migrations` — schema, recorded migrations under an advisory lock;
* :mod:`memory.pg.indexer` — chunking of the sessions' messages (read through
  :mod:`sessions.pg.feed`, which owns their tables) claimed per session
  (``FOR UPDATE SKIP LOCKED``), embedding each distinct text once across nodes;
* :mod:`memory.pg.vectors` — the vector leg's index, made once the embedder's width is known;
* :mod:`memory.pg.search` — keyword (BM25), vector and hybrid in one statement;
* :mod:`memory.pg.facts`, :mod:`memory.pg.episodes` — the SQLite stores' methods, awaited;
* :mod:`memory.pg.service` — ``PgMemory``, the thin top (search, status, reindex, forget,
  the indexing loop woken by the sessions store's change notifications);

Choices, as measured (shared 2-core machine; commands in the phase-1 report):

* **Keyword leg: BM25 in SQL, not ``ts_rank_cd``.** ``bench/recall.py bench/data/sample.json
  --embedder local`` with the SQLite run's embedding cache seeded (identical vectors), R@10
  SQLite / PostgreSQL BM25 / ``ts_rank_cd``: turn keyword 0.688 / 0.681 / 0.712, hybrid
  0.910 / 0.903 / 0.912; chunk keyword 0.982 / 0.982 / 0.982, hybrid 1.000 / 1.000 / 1.000;
  vector 0.941 and 1.000 on both. ``ts_rank_cd`` moves turn keyword by +0.024, outside the
  0.01 the issue allows either way; BM25 with FTS5's constants and whole-table statistics gives
  FTS5's own scores on plain English (tests/memory/pg/test_pg_search.py) and stays within
  0.007 — the rest is tokenisation (PostgreSQL's parser and the Snowball stemmer against
  unicode61 + Porter; no diacritic folding, the wheel ships no ``unaccent``).
* **Vector leg: HNSW.** 50,000 clustered 384-dim int8 vectors, 100 queries: HNSW
  (``halfvec_cosine_ops``, m 16, ef_construction 64, ef_search 100) recall@10 against an exact
  scan 1.000, p50 12.2 ms, p90 23.8 ms, build 52 s; sign bits + Hamming (a scan, pool 1,000)
  then exact cosine, SQLite's two steps, recall@10 1.000, p50 132–144 ms, p90 166–184 ms.
  The bit leg stays selectable (``vector_leg="bit"``).
* **Keyword leg from postings, not from each match's tsvector.** 100,000 generated chunks of 60
  words (power-law ranks), 20 three-word queries each, load average ~9: BM25 unpacking the
  ``tsvector`` of every GIN match took p50 49 / 244 / 812 ms for rare / mid / common words;
  read from ``recalld_memory_postings`` 41 / 73 / 147 ms (``keyword_common_share`` 0: 76 / 94 /
  276). The trigger that keeps the postings made that build 183 s instead of 58 s (a per-row
  trigger then; since m003 one call per INSERT statement, and no by-chunk postings index).
  Since m006 the postings are kept in blocks (one row per lexeme, user and INSERT statement,
  the chunks' ids, tfs and lengths as arrays): a keyword-only build of the 100k scale corpus
  ~5,300 chunks/s against ~3,600 with a row per posting, 177 MB of postings against 1,394
  (``research.pg_build``; docs/scaling.md).
"""
