"""Tiering of sealed segments to object storage (see the cold tier issue); nothing here yet."""
