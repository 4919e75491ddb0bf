"""The SGLang server under test: `plan` (profile + config -> argv/env/config file), `lifecycle` (launch, ready,
watch, stop by process group), `ladder` (every level of every workload on one launch, watched for crashes)."""
