"""Outbound HTTP: a request with a hard wall-clock deadline (deadline), model
calls (model_client), the SSRF guard (netguard), header specs (headers)."""
