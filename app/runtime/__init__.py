"""Process machinery every layer may use: `blocking`, the thread pools blocking calls run on."""
