"""Who calls: API keys and the Principal (keys), the creator behind a
trusted gateway (identity), and their contracts (schemas)."""
