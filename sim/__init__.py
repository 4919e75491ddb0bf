"""tunectl.sim: the SGLang stand-in (`python -m tunectl.sim.launch_server`) and its virtual-clock model
(`tunectl.sim.model`), both driven by a sim card (`sim/cards/*.yaml`). See docs/sim.md."""
