"""The null proxy: the least an HTTP pass-through can do, as a baseline for ``contextfold proxy``.

A tiny aiohttp app that forwards every ``POST`` to the same path on the upstream and streams
the reply back chunk by chunk as it arrives: no parsing, no memory, no logging. It runs on
the same event loop ``contextfold proxy`` uses (uvloop where installed), so the difference
between the two is what contextfold does, not the framework or the loop.

Run: ``python benchmarks/null_proxy.py --upstream http://127.0.0.1:PORT``; it binds a free
port on 127.0.0.1 and prints its URL on the first line of stdout once it accepts requests.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

# Per-connection headers: the framework sets them again on each side.
HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)


CLIENT = web.AppKey("client", aiohttp.ClientSession)


def make_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def client(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=1000, keepalive_timeout=60)
        app[CLIENT] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        yield
        await app[CLIENT].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        url = upstream.rstrip("/") + request.path_qs
        async with request.app[CLIENT].post(url, data=body, headers=headers) as reply:
            out = web.StreamResponse(
                status=reply.status,
                headers={k: v for k, v in reply.headers.items() if k.lower() not in HOP},
            )
            await out.prepare(request)
            async for chunk in reply.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app.cleanup_ctx.append(client)
    app.router.add_post("/{path:.*}", forward)
    return app


async def serve(upstream: str) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(make_app(upstream), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:  # the same fallback as `contextfold proxy`
        asyncio.run(serve(args.upstream))
    else:
        uvloop.run(serve(args.upstream))


if __name__ == "__main__":
    main()
