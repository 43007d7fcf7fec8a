"""HTTP route families: thin adapters that name a stream and hand the request to the protocol core."""
