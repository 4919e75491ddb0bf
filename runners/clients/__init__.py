"""Load clients: each measures one concurrency level against a running server and returns the metrics under
`sglang.bench_serving`'s result keys. `builtin` (tunectl's own asyncio client) and `bench_serving` (the real
`sglang.bench_serving`, run on the server's host)."""
