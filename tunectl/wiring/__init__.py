"""The wiring: what puts the rooms together into a study. `study` (search + runner + store), `trial` (one trial:
plan, patch, launch, ready, ladder, teardown), `virtual` (a trial on the stand-in's model), `replay` and
`landscape` (measured tables), `identity` (a study's fingerprint), `warmstart` and `migrate` (a study from an old
one, a profile on another SGLang version), `storage` (the --storage URL), `recovery` (trial files and storage in
step), `slots` and `parallel` (GPUs split into slots, the trial engine on all of them), `slurm_trials` and
`slurm_agent` (a trial as a Slurm job). It imports the rooms and the ground floor; nothing below imports it
(docs/architecture.md)."""
