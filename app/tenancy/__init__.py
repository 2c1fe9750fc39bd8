"""Who calls: API keys and the Principal (keys), the creator behind a gateway (identity), limits, contracts."""
