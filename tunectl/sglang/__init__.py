"""SGLang's physics, in one room: what tunectl knows of SGLang itself, apart from how it searches or runs.

`flags` (the flag names and their `--help` specs, bundled per version in `help/`), `versions` (flags across SGLang
versions: renames, deprecations, removals), `scopes` (where a flag acts at all, read from SGLang's source),
`source` (the `--config` refusals read from SGLang's parser), `crashes` (the crash catalog and the classifier,
which writes the one list of log facts, `LOG_FACTS`) and `memory` (OOM messages, CUDA graph memory, the KV pool's
bounds and the changes a served config's log asks for). The search reads this room; it imports nothing above
the ground floor.
"""
