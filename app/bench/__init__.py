"""`rill bench`: workloads that measure any Durable Streams server, and Rill beside the reference server."""
