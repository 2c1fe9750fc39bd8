"""The service layer: plain functions both HTTP faces, the CLI and the
workers call.  Domain errors are raised here; HTTP is decided at the edge."""
