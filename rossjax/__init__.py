"""rossjax: turn the experience LLM post-training leaves behind into better models, on JAX.

The package is split in two halves. `rossjax.curate` is the CPU curation pipeline and never
imports jax; everything else (`models`, `train`, `sample`, `probes`) is the device half.
Import submodules explicitly; this top-level module stays light so curation workers stay jax-free.
"""

__version__ = "0.1.0"

# before anything imports jax: $ROSSJAX_HOST_HEAP=keep (rossjax/hostheap.py)
from rossjax import hostheap as _hostheap

_hostheap.apply_from_env()
