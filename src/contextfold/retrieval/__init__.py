"""Retrieval: documents in, ranked context out.

``chunking`` splits documents, ``embedders`` turn text into vectors, ``sparse`` (BM25) and
``dense`` (vector indexes) rank chunks, ``fusion`` merges rankings (RRF, MMR), ``index``
(``DocumentIndex``) ties them to the SQLite document store, ``retrievers`` rank items you
already hold, ``graph`` builds knowledge-graph context, and ``engine`` is the
``ContextEngine`` facade. Import from the submodules (or from ``contextfold``); nothing heavy
loads until used.
"""
