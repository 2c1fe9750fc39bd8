"""The catalog: model configurations (registry), model types, a model's
form and how a payload is checked against it (forms), JSON import/export
(transfer), and their contracts (schemas)."""
