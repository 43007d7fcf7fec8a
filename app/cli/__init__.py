"""`rill`, the command line: `program.py` parses the arguments and runs a command; `data.py` and the
modules beside it are the data commands (buckets, streams, append, read, tail, subs), `cluster.py`
starts and inspects a cluster. `python -m app.cli` is the same as `rill`.
"""
