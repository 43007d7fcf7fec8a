"""Content types as the protocol compares them."""

from __future__ import annotations

from functools import lru_cache

DEFAULT_CONTENT_TYPE = "application/octet-stream"
JSON = "application/json"


@lru_cache(maxsize=1024)
def media_type(content_type: str) -> str:
    """The comparable part of a content type: lower-cased, parameters dropped."""
    return content_type.split(";", 1)[0].strip().lower()
