"""The node's service layer: what the protocol calls to write through Raft and read the state.

`engine.py` is the one object the route families, the cluster routes and the background workers
go through; `build.py` constructs a node's parts in order. Limits, the body budget, the change
signals and the clock are small modules of their own.
"""
