"""Clients of remote model endpoints (OpenAI-compatible chat): timeouts, Retry-After, and secrets kept out of logs."""
