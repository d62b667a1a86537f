"""Prefect tasks: thin wrappers over one `mascot` library function each, adding caching, retries and artifacts."""
