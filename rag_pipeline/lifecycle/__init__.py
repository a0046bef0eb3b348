"""Keeping the index true over time: preparing a database, blue/green index versions, the checks, erasure and alerts."""
