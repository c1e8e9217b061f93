"""Fairgate: an admission proxy that shares Ollama and llama.cpp servers fairly.

The packages stack in one direction (docs/architecture.md); this top level holds only the
entry points (``__main__``, ``app``), the composition root (``services``) and the policy in
force (``reload``).

May import: all of its packages.
"""

__version__ = "0.1.0"
