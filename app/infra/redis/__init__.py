"""Redis: derived state only (docs/architecture.md, invariant 1).

One module per concept, every key name in ``keys.py``, every client in
``client.py``; each Lua script is a ``.lua`` file next to the module that
owns its keys (named after it), opening with its KEYS/ARGV contract, run
only through the registry ``scripts.py`` by the module's typed functions.
"""
