"""HTTP edge: thin blueprints over app.services."""
