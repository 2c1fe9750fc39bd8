"""``python -m app.cli``: the same as the ``asynch`` command."""
from app.cli import main

main()
