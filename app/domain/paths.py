"""Where each route family lives: the one place its URL prefix is spelled."""

from __future__ import annotations

DS_PREFIX = "/ds/"  # /ds/{bucket}/{stream}: the primary family, with buckets
LEGACY_PREFIX = "/streams/"  # /streams/{id}
COMPAT_PREFIX = "/v1/stream/"  # /v1/stream/{path}: the reference server's shape
BUCKET_LIST = "/ds"
INTERNAL_PREFIX = "/_rill/"  # the cluster's own routes and the probes' status
RAFT_PATH = "/_rill/raft"  # peers' Raft messages
