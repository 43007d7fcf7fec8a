"""What every layer shares: offsets, media types and the error a request can fail with. No web, no I/O."""
