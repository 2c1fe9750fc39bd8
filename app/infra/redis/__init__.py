"""Redis: derived state only (docs/architecture.md, invariant 1).  One module per concept, every key name in
``keys.py``, every client in ``client.py``, every Lua script (``<module>_*.lua``) run through ``scripts.py``."""
