"""Tooling for tests, chapters and the benchmark: processes this Python process starts
on loopback and stops by PID.

- `server.RedisServer`: a private, throw-away redis-server on a free port;
- `cluster.LocalCluster`: a local Redis Cluster (`make cluster-up` / `cluster-down`);
- `demo_server.DemoServer`: the demo API under uvicorn;
- `process`: what they share (free ports, start, stop by PID).

Not part of the library a service imports.
"""
