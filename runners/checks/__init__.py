"""Is a host ready for a study: `readiness` (`run_checks`, the table `tunectl check` prints), `hostcheck` (GPU
memory, leftover servers), `flagcheck` (the profile's flag names against the engine's --help) and `patches`
(the bundled SGLang patches, applied on the host by `_patch_helper.py`)."""
