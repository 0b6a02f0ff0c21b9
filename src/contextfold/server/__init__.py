"""The HTTP server: a transparent LLM proxy, ``POST /api/context`` and a live dashboard.

Needs the ``server`` extra (``pip install 'contextfold[server]'``). Nothing here runs at import.
"""
