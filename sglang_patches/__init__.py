"""Bundled SGLang source patches (package data): see manifest.yaml."""
