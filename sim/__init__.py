"""tunectl.sim: the SGLang stand-in (`python -m tunectl.sim.launch_server`) and its virtual-clock model
(`tunectl.sim.model`), both driven by a sim card (`sim/cards/*.yaml`). See docs/sim.md.

`TOKENIZER`: the small BPE tokenizer (vocabulary 4,096) that clients needing one (the real `sglang.bench_serving`)
use against the stand-in when the profile names none: the stand-in's models are not on disk.
"""
from pathlib import Path

TOKENIZER = Path(__file__).resolve().parent / "tokenizer"
