"""Celery side: the app and thin tasks that call the service layer."""
