"""The SQLite backend of memory: one ``memory.db`` file beside the JSONL transcripts.

FTS5 is the keyword leg, sqlite-vec's ``chunks_vec`` the vector leg (with an in-memory sign
index in front of it), the embedding cache and facts and episodes tables sit in the same file,
and a ``watchfiles`` watcher on the sessions folder drives the debounced sync. The rules it runs
are memory's neutral modules (:mod:`memory.retrieval`, :mod:`memory.facts`,
:mod:`memory.episodes`, :mod:`memory.context`); what is here is storage and its SQL:

- :mod:`.service` — :class:`MemoryService`, the :class:`~memory.protocols.Memory` of this backend;
- :mod:`.live` — what an open index holds (connections, indexer, sign index, common terms);
- :mod:`.index` — the schema and migrations, transcripts → chunks, vectors and their cache,
  the KNN pre-filter, the sync scheduler;
- :mod:`.pipeline`, :mod:`.search`, :mod:`.common_terms` — a search from request to hits;
- :mod:`.previous`, :mod:`.interim` — the previous embedder's vectors during a rebuild;
- :mod:`.facts`, :mod:`.episodes` — the fact and episode stores (blocking apsw calls run by
  :class:`~memory.sqlite.index.db.IndexSteps`);
- :mod:`.forgetting`, :mod:`.status` — what must not be indexed, what ``memory.status`` counts.

Importers outside ``memory`` use the names of ``memory`` itself; these modules may move.
"""
