"""Knowledge about how SGLang fails: `catalog` (the crash signatures, their classes and repairs) and
`classifier` (classify a log text, watch a growing log). Imports only tunectl.models: the live path (runners),
the virtual path and the search all read it."""
