"""model-asynch's Python client: ``Client`` (blocking, requests) and
``AsyncClient`` (asyncio, aiohttp: ``pip install model-asynch[client-async]``).

Independent of the server package (``app``): it talks HTTP only, so it can be
used from anywhere the API is reachable.  docs/client.md shows each call.
"""
from model_asynch import client as _client
from model_asynch.client import *  # noqa: F403 - the public names, client.__all__

__all__ = ["AsyncClient", *_client.__all__]


def __getattr__(name: str):
    if name == "AsyncClient":  # aiohttp only when asked for
        from model_asynch.aio import AsyncClient

        return AsyncClient
    raise AttributeError(name)
