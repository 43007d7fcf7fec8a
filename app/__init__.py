"""Rill: a durable streams server."""

__version__ = "0.1.0"
