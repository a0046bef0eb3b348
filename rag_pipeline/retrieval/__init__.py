"""Reading the index: search options and the hybrid search, golden-set evaluation, the HTTP service and the application integrations."""
