"""tunectl.reports."""
