"""A LlamaIndex retriever over the search service.

    from rag_pipeline.retrieval.integrations.llamaindex import RagPipelineRetriever
    retriever = RagPipelineRetriever(url="http://search.internal:8000", token=os.environ["RAG_SEARCH_TOKEN"], k=5)
    nodes = retriever.retrieve("how far ahead should flights be booked")
"""

from __future__ import annotations

from typing import Any

import httpx
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from rag_pipeline.retrieval.integrations.client import SearchClient, metadata_of, refuse_arguments

# what llama_index's BaseRetriever.__init__ takes; anything else is refused here, by name and with the reason
_BASE_ARGUMENTS = ("callback_manager", "object_map", "objects", "verbose")


class RagPipelineRetriever(BaseRetriever):
    """Nodes from `rag-pipeline serve`: each a TextNode (id = chunk id) with the chunk's path, pages, flags in
    metadata and the fused score. The token's labels filter every search, inside the database."""

    def __init__(self, url: str = "http://127.0.0.1:8000", token: str | None = None, *, k: int = 10,
                 mode: str = "hybrid", timeout: float = 30.0, http_client: httpx.Client | None = None,
                 **kwargs: Any) -> None:
        refuse_arguments({name: value for name, value in kwargs.items() if name not in _BASE_ARGUMENTS},
                         type(self).__name__)
        self._client = SearchClient(url, token, timeout=timeout, http_client=http_client)
        self._k, self._mode = k, mode
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(id_=result["chunk_id"], text=result["text"], metadata=metadata_of(result)),
                              score=result["score"])
                for result in self._client.search(query_bundle.query_str, self._k, self._mode)]
