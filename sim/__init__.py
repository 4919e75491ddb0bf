"""tunectl.sim."""
