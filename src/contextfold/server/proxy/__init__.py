"""The transparent LLM proxy, one module per step of a request's way:

- ``session`` — who asks and which conversation turn the request continues (markers, header);
- ``wire`` — the provider payloads (OpenAI, Anthropic, Gemini): parse, strip, inject, drop;
- ``routes`` — the provider routes and the ``Proxy`` that runs each request through the steps;
- ``stream`` — the upstream reply relayed to the client (SSE events, markers, synthesized streams);
- ``markers`` — which replies may carry the session marker (none where it would break the client);
- ``record`` — the dashboard record of one request;
- ``writer`` — the memory writes after a reply.
"""

from contextfold.server.proxy.routes import Proxy, ProxyRouter, error_response, router, upstream_url

__all__ = ["Proxy", "ProxyRouter", "error_response", "router", "upstream_url"]
