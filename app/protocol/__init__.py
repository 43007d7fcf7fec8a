"""The one protocol core behind every route family: parse requests, run them, render responses."""
