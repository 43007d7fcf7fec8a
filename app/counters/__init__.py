"""Counters and histograms as plain numbers, cheap enough for the hot path.

The code that does the work bumps these; nothing here locks or formats. `/metrics` reads them when
it is scraped (app/observability/metrics.py), so a request pays for an add, not for a client library.
A leaf package: the Raft driver, the tiering worker and the engine count without importing what
renders the counts.
"""
