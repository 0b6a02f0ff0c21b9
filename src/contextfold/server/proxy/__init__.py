"""The transparent LLM proxy, one module per step of a request's way:

- ``session`` — who asks (the principal) and which turn of which branch the request continues;
- ``wire`` — the provider payloads (OpenAI, Anthropic, Gemini): parse, strip, inject, drop;
- ``responses`` — the OpenAI Responses API: its items, reply, stream events and response ids;
- ``recall`` — memory for the request under its deadline: position, recall, history, inject;
- ``encoding`` — request bodies sent compressed (``Content-Encoding``: gzip, deflate, zstd);
- ``forward`` — the upstream call: URL, headers, the aiohttp client, provider-shaped errors;
- ``stream`` — the reply relayed to the client (SSE events, the marker's place, synthesized
  streams); ``markers`` — where a marker may go;
- ``commit`` — the raw exchange, committed before the reply's last byte;
- ``record`` — the dashboard record of one request, and its reply tags once derived;
- ``routes`` — the provider routes and the ``Proxy`` that takes each request through these.

Derived work (tags, vectors, compaction) runs as store jobs: ``contextfold.server.jobs``.
"""

from contextfold.server.proxy.forward import error_response, upstream_url
from contextfold.server.proxy.routes import Proxy, ProxyRouter, router

__all__ = ["Proxy", "ProxyRouter", "error_response", "router", "upstream_url"]
