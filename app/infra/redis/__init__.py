"""Redis: derived state only (docs/architecture.md, invariant 1).

One module per concept, every key name in ``keys.py``, every client in
``client.py``; each Lua script sits above the typed function that runs it,
with its KEYS/ARGV contract written above it.
"""
