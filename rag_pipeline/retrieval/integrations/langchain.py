"""A LangChain retriever over the search service.

    from rag_pipeline.retrieval.integrations.langchain import RagPipelineRetriever
    retriever = RagPipelineRetriever(url="http://search.internal:8000", token=os.environ["RAG_SEARCH_TOKEN"], k=5)
    documents = retriever.invoke("how far ahead should flights be booked")
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from rag_pipeline.retrieval.integrations.client import SearchClient, metadata_of, refuse_arguments


class RagPipelineRetriever(BaseRetriever):
    """Documents from `rag-pipeline serve`: page_content is the chunk's text; metadata has its chunk id, path,
    pages, score and flags. The token's labels filter every search, inside the database."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    url: str = "http://127.0.0.1:8000"
    token: str | None = Field(default=None, repr=False, description="API token; default RAG_SEARCH_TOKEN")
    k: int = 10
    mode: Literal["hybrid", "dense", "sparse"] = "hybrid"
    timeout: float = 30.0
    http_client: Any = Field(default=None, exclude=True, repr=False)
    _client: SearchClient = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _known_arguments(cls, values: Any) -> Any:
        # pydantic would name them too, as "extra inputs"; this says why (labels come from the token)
        if isinstance(values, dict):
            refuse_arguments({name: value for name, value in values.items() if name not in cls.model_fields},
                             cls.__name__)
        return values

    def model_post_init(self, context: Any) -> None:
        self._client = SearchClient(self.url, self.token, timeout=self.timeout, http_client=self.http_client)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        # invoke(query, labels=...) hands its keyword arguments here (dropped silently without **kwargs); `verbose`
        # is LangChain's own, read by its callbacks
        refuse_arguments({name: value for name, value in kwargs.items() if name != "verbose"},
                         f"{type(self).__name__}.invoke")
        return [Document(page_content=result["text"], metadata=metadata_of(result), id=result["chunk_id"])
                for result in self._client.search(query, self.k, self.mode)]
