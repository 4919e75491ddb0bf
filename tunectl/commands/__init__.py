"""CLI command modules; each registers its commands on tunectl.cli.app."""
