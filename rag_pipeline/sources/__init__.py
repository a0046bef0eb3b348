"""Sources of documents: a scanner yields DiscoveredFiles; local folders today."""
