"""HTTP edge: thin blueprints over the feature packages' services."""
