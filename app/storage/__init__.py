"""Ordered key-value storage shared by the Raft log and the state machine."""
