"""The cold tier: sealed segments as Parquet in an object store, read back through a cache.

`segment` is the file format, `store` the object stores (S3, a directory), `cache` the read-side
segment cache, `retention` the automatic retention rule, and `worker` the leader's loop that
seals, uploads, records (through Raft), evicts and collects.
"""
