"""Files (/v1/files, OpenAI's shapes): uploads streamed to storage per tenant (service), their shapes (schemas)."""
