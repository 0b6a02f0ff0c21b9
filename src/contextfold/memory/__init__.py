"""Conversation memory: turns are stored raw, tagged by topic, compacted into summaries and paged
back in on demand (see ``MemoryEngine``)."""
