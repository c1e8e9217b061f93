"""The ``fairgate`` commands beside ``serve``: init, status, usage, keys, check-config, what
serve says before it serves, and the demo.

May import: ``app`` and every package below it.
"""
