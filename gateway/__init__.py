"""Fairgate: an admission proxy that shares Ollama and llama.cpp servers fairly."""

__version__ = "0.1.0"
