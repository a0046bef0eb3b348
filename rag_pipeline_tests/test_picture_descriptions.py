"""Pictures described by a vision-language model, end to end over real HTTP against a small OpenAI-compatible server
on 127.0.0.1: the request carries the cropped picture, the answer lands in the figure chunk, a re-parse reads it
from the cache, and the budget and the timeout are honoured (a picture left undescribed, never a document lost).
No vision model can run here: what a description is worth is not measured (docs/parsing.md)."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import pytest
from dagster import DagsterInstance
from pydantic import ValidationError

from rag_pipeline.config import VlmConfig
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.parsing.pictures import Picture, picture_from_record, picture_record
from rag_pipeline.retrieval.search import search
from rag_pipeline.text.figures import figure_text
from rag_pipeline_tests.chat_server import JsonServer
from rag_pipeline_tests.conftest import report_with_a_chart

ANSWER = "A bar chart of robots shipped by plant: Lyon 420, Turin 310, Graz 260, Porto 180; the Lyon bar is blue."


class VisionServer(JsonServer):
    """Answers a chat request that carries an image with ANSWER (after `delay` seconds); keeps the images."""

    def __init__(self) -> None:
        self.images: list[bytes] = []
        self.delay = 0.0
        super().__init__("/v1")

    def reply(self, path: str, body: Any) -> Any:
        if path != "/v1/chat/completions":
            return None
        parts = body["messages"][0]["content"]
        urls = [part["image_url"]["url"] for part in parts if part.get("type") == "image_url"]
        self.images += [base64.b64decode(url.split(",", 1)[1]) for url in urls]
        time.sleep(self.delay)
        return {"choices": [{"message": {"role": "assistant", "content": ANSWER}}]}


@pytest.fixture
def vision():
    server = VisionServer()
    yield server
    server.stop()


def test_a_description_joins_the_figure_chunk_after_the_pictures_own_words():
    chart = Picture(1, "drawing", (100.0, 150.0, 500.0, 460.0), "Figure 1: Robots shipped by plant",
                    "420 310 260 180\nLyon Turin Graz Porto")
    assert figure_text(chart) == "Figure 1: Robots shipped by plant\n420 310 260 180\nLyon Turin Graz Porto"
    described = Picture(*[getattr(chart, f) for f in ("page", "kind", "box", "caption", "text")], ANSWER)
    assert figure_text(described) == figure_text(chart) + f"\nDescribed: {ANSWER}"  # only the end changes
    photo = Picture(2, "image", (72.0, 72.0, 300.0, 300.0), None, "")
    assert figure_text(photo) is None  # a photo without words says nothing of its own
    assert figure_text(Picture(2, "image", photo.box, None, "", "A harbour crane at dusk.")) == (
        "Figure\nDescribed: A harbour crane at dusk.")
    # Kept with the page and read back; a record without one is as it always was.
    assert picture_from_record(1, picture_record(described)) == described
    assert "description" not in picture_record(chart)
    with pytest.raises(ValidationError, match="describe_pictures needs endpoint and model"):
        VlmConfig(describe_pictures=True)


def _settings(make_settings, root, server: VisionServer, **vlm):
    vlm = {"endpoint": server.url, "model": "vision-test", "describe_pictures": True, "timeout_seconds": 5,
           "max_retries": 0, **vlm}
    return make_settings([{"name": "reports", "root": str(root), "acl_labels": ["staff"]}],
                         parsing={"ocr_engine": "none", "vlm": vlm})


def _figure_texts(db) -> list[str]:
    return [text for (text,) in db.execute("SELECT text FROM chunks WHERE content_type = 'figure'")]


def test_a_picture_is_described_once_and_found_by_what_the_model_said(tmp_path, make_settings, db, vision):
    from PIL import Image

    root = tmp_path / "reports"
    root.mkdir()
    report_with_a_chart(root / "plants.pdf")
    settings = _settings(make_settings, root, vision)
    with DagsterInstance.ephemeral() as instance:
        first = run_ingest(settings, instance=instance)
    assert first["success"] and first["pictures_described"] == 1
    [image] = vision.images
    crop = Image.open(io.BytesIO(image))
    # the chart's box (about 400 x 330 points) at 150 dpi, not the 612 x 792 page
    assert crop.format == "PNG" and 700 < crop.width < 1000 and 550 < crop.height < 800, crop.size
    [text] = _figure_texts(db)
    assert text.startswith("Figure 1: Robots shipped by plant\n") and text.endswith(f"\nDescribed: {ANSWER}")
    hits = search(db, "which plant had the blue bar", ["staff"], k=3)
    assert hits and hits[0].content_type == "figure"
    # The file changes (its prose), the chart does not: parsed again, its description read from the cache.
    (root / "plants.pdf").write_bytes((root / "plants.pdf").read_bytes() + b"\n% edited\n")
    with DagsterInstance.ephemeral() as instance:
        second = run_ingest(settings, instance=instance)
    assert second["success"] and second["pictures_described"] == 0 and len(vision.images) == 1
    assert _figure_texts(db) == [text]
    assert db.execute("SELECT count(*) FROM picture_descriptions").fetchone()[0] == 1


def test_the_budget_and_the_timeout_leave_a_picture_undescribed_and_the_document_indexed(tmp_path, make_settings, db,
                                                                                        vision):
    root = tmp_path / "reports"
    root.mkdir()
    report_with_a_chart(root / "plants.pdf")
    with DagsterInstance.ephemeral() as instance:
        spent = run_ingest(_settings(make_settings, root, vision, picture_budget=0), instance=instance)
    assert spent["success"] and spent["pictures_described"] == 0 and vision.images == []
    assert [t.endswith("Porto") for t in _figure_texts(db)] == [True]  # the chunk without a model's words

    vision.delay = 3.0  # past the 1 s timeout, no retry
    (root / "plants.pdf").write_bytes((root / "plants.pdf").read_bytes() + b"\n% edited\n")
    started = time.monotonic()
    with DagsterInstance.ephemeral() as instance:
        slow = run_ingest(_settings(make_settings, root, vision, timeout_seconds=1), instance=instance)
    assert slow["success"] and slow["pictures_described"] == 0
    assert time.monotonic() - started < 60
    assert db.execute("SELECT status FROM documents").fetchone()[0] == "indexed"
    assert "Described" not in _figure_texts(db)[0]
    assert db.execute("SELECT count(*) FROM picture_descriptions").fetchone()[0] == 0


def test_an_answer_without_text_is_no_description():
    """A reasoning model that spends its tokens thinking answers `content: null`: an endpoint failure (the picture
    left undescribed), never the text "None" cached and indexed."""
    from rag_pipeline.endpoints.chat import ChatClient, EndpointError

    class Silent(JsonServer):
        def reply(self, path: str, body: Any) -> Any:
            return {"choices": [{"message": {"role": "assistant", "content": None}, "finish_reason": "length"}]}

    server = Silent("/v1")
    try:
        client = ChatClient(server.url, "m", max_retries=0, timeout_seconds=5)
        with pytest.raises(EndpointError, match="holds no text"):
            client.chat([{"type": "text", "text": "describe"}], 10)
        client.close()
    finally:
        server.stop()
