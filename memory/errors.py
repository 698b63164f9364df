"""The memory package's exceptions.

Tree::

    MemoryIndexError
    ├── InvalidSearch              ``field`` names the bad parameter
    ├── MemoryUnavailable          the service is closed or not started
    ├── MemoryStorageError         SQLite failed (disk full, I/O, locked)
    ├── EmbedderError              the embedder failed; ``retryable``, ``status``
    ├── InvalidFact                a fact is empty, too long, or names a retired fact; ``field``
    ├── FactNotFound               no such fact for this user
    └── SummarizerError            the model writing an episode's summary failed (never on the wire)

The package knows nothing of JSON-RPC: ``gateway.errors`` maps each class to a code in one
place. Messages are short, safe for the wire, and never contain chunk text or API keys.
"""

from __future__ import annotations

__all__ = [
    "EmbedderError",
    "FactNotFound",
    "InvalidFact",
    "InvalidSearch",
    "MemoryIndexError",
    "MemoryStorageError",
    "MemoryUnavailable",
    "SummarizerError",
]


class MemoryIndexError(Exception):
    """Root of every error the memory package raises on purpose."""



class InvalidSearch(MemoryIndexError):
    """A search parameter is out of range or malformed; ``field`` is its wire name."""


    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


class MemoryUnavailable(MemoryIndexError):
    """The service is not started, or already closed."""



class MemoryStorageError(MemoryIndexError):
    """The index database failed in a way the caller cannot fix (disk, I/O)."""



class EmbedderError(MemoryIndexError):
    """An embedder call failed; ``retryable`` says whether a later attempt may succeed."""


    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class InvalidFact(MemoryIndexError):
    """A fact cannot be saved as given; ``field`` is the wire name of the bad parameter."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


class FactNotFound(MemoryIndexError):
    """No fact with that id belongs to the user (another user's fact reads the same)."""


class SummarizerError(MemoryIndexError):
    """The summarizer the gateway handed memory could not answer; the episode job is retried."""
