"""The catalog: models (registry), model types, forms, import/export (transfer), contracts (schemas)."""
