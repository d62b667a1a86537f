"""The `mascot` command (`cli.main:app`)."""
