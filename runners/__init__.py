"""tunectl.runners."""
