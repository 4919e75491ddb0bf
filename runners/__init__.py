"""tunectl.runners: processes only (never Optuna). One sub-package per concern, see docs/architecture.md:

- `hosts`: where commands run. The `Runner` protocol (`hosts.base`), `LocalRunner`, `SSHRunner`.
- `server`: the SGLang server under test. Its launch plan, its lifecycle (launch, ready, watch, stop), the ladder.
- `clients`: load clients that measure one concurrency level (the built-in client, `sglang.bench_serving`).
- `checks`: is a host ready (readiness, GPU/leftover checks, flag names against --help) and the SGLang patches.
"""
