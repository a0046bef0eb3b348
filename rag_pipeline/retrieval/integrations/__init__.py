"""Clients of the search service for applications: rag_pipeline.retrieval.integrations.langchain and .llamaindex.

They import only httpx and their framework (never dagster, docling or torch: the query is embedded by the
service), so an application installs `dagster-rag-pipeline[langchain]` or `dagster-rag-pipeline[llamaindex]` beside its own code.
"""
