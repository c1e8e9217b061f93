"""swaps."""
