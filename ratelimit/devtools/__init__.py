"""Tooling for tests, chapters and the benchmark: processes this Python process starts
on loopback and stops by PID.

- `server.RedisServer`: a private, throw-away redis-server on a free port;
- `cluster.LocalCluster`: a local Redis Cluster (`make cluster-up` / `cluster-down`);
- `sentinel.LocalSentinel`: a primary, a replica and three Sentinels (`make sentinel-up` /
  `sentinel-down`);
- `recorded`: the state file that `cluster-up` and `sentinel-up` leave, and stopping
  exactly the PIDs it records;
- `demo_server.DemoServer`: the demo API under uvicorn, in one process or several workers;
- `load.run_load`: a bounded HTTP load generator (N connections, a count or a duration);
- `process`: what they share (free ports, start, stop by PID).

Not part of the library a service imports.
"""
