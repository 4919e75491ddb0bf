"""tunectl.search."""
