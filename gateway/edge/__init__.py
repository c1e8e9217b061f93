"""edge."""
