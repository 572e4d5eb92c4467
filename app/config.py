"""Settings: every knob memproxy has, read from the environment (prefix ``MEMPROXY_``) and ``.env``.

Nothing here runs at import time: ``Settings()`` is built by ``create_app`` (or by a test that
passes its own), so two apps with different settings can live in one process.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from app.config_manager import ManagerSettings
from app.proxy.user_ids import UserIdRefused, normal_user_id

CommaList = Annotated[list[str], NoDecode]
"""A list given in the environment as comma-separated values (``a,b,c``), not as JSON."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One entry of ``MEMPROXY_API_KEYS``: the key, and the user it is bound to (if any)."""

    key: str
    user_id: str | None


class Settings(ManagerSettings):
    """memproxy's configuration. ``.env.example`` documents every field with its default."""

    model_config = SettingsConfigDict(
        env_prefix="MEMPROXY_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
    )

    # --- server -------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    """Address `memproxy serve` listens on (0.0.0.0 inside a container)."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port `memproxy serve` listens on."""
    log_level: str = "INFO"
    """Python logging level for memproxy's own loggers (DEBUG adds the memories injected into
    each chat: their texts)."""
    log_format: Literal["text", "json"] = "text"
    """`text`: readable lines; `json`: one JSON object per line (app/log.py lists the keys)."""

    # --- upstream -----------------------------------------------------------------------------
    upstream_base_url: str = "http://localhost:11434/v1"
    """Base URL of the real OpenAI-compatible server; `/chat/completions` etc. are appended."""
    upstream_api_key: SecretStr | None = None
    """Bearer key memproxy sends upstream. Unset: docs/how-it-works.md#headers-sent-upstream."""
    upstream_connect_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long to wait for a TCP/TLS connection to the upstream before answering 504."""
    upstream_read_timeout_seconds: float = Field(default=600.0, gt=0)
    """Longest silence allowed between two reads from the upstream (a slow first token counts)."""
    upstream_max_connections: int = Field(default=512, ge=1)
    """Size of the shared connection pool to the upstream."""
    upstream_check_at_start: bool = True
    """Ask the upstream for its model list once at start and warn when it does not answer or
    refuses the key (start never fails on it)."""
    upstream_ca_file: str = ""
    """PEM file of CA certificates to trust for an HTTPS upstream and Manager, beside the usual
    ones: for a server whose certificate a private CA signed."""
    upstream_verify: bool = True
    """Check the TLS certificate of an HTTPS upstream and Manager. false: not checked at all
    (anyone on the network path can read and change the chats; warned at start)."""
    models_cache_seconds: float = Field(default=10.0, ge=0)
    """How long a `/v1/models` answer is reused (Open WebUI asks on every chat). 0 disables."""
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Largest request body accepted (413 beyond it); large enough for several base64 images."""
    memory_max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest body the memory API accepts (413 beyond it): an import of ~50,000 typical
    memories; a bigger export is imported in parts (import is idempotent on id)."""
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest request line plus headers `memproxy serve` reads (431 beyond it)."""
    client_header_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long `memproxy serve` waits for a request's headers once a connection is open or a
    request has begun (408, or the connection closed when nothing came)."""
    client_body_timeout_seconds: float = Field(default=30.0, gt=0)
    """Longest pause while a request body arrives before the request is answered 408."""
    client_body_deadline_seconds: float = Field(default=300.0, gt=0)
    """Longest a whole request body may take to arrive (408 beyond it), however steadily it
    trickles in: 300 s carries a 64 MiB body at ~220 KB/s."""
    max_connections: int = Field(default=1000, ge=1)
    """Requests `memproxy serve` serves at once (503 beyond it). Idle connections do not count:
    a request beginning with more connections open closes the one idle the longest (no whole
    request after 1 s, else kept alive between requests)."""
    crowded_keep_alive_seconds: float = Field(default=1.0, gt=0)
    """How long `memproxy serve` keeps a connection open between requests once the open ones
    reach 3/4 of `max_connections` (else 5 s)."""
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    """Once `memproxy serve` is asked to stop (SIGTERM, Ctrl-C), how long the answers under way
    may still take: then a stream ends with a final error event, an answer not begun with 503
    `shutting_down` (0: at once). A second Ctrl-C ends everything at once."""

    # --- storage ------------------------------------------------------------------------------
    database_url: str = "sqlite+aiosqlite:///./data/memproxy.db"
    """SQLAlchemy async URL of the memory database (PostgreSQL: postgresql+asyncpg://...)."""
    database_pool_size: int = Field(default=5, ge=1, le=1000)
    """PostgreSQL: connections each process keeps open (several replicas: the sum must stay
    under the server's `max_connections`)."""
    database_max_overflow: int = Field(default=5, ge=0, le=1000)
    """PostgreSQL: connections a process may open beyond the pool under load, closed after."""
    database_pool_pre_ping: bool = True
    """PostgreSQL: test a pooled connection before using it, so that one the server closed (a
    restart, an idle timeout) is replaced instead of failing the request."""
    database_pgbouncer: bool = False
    """PostgreSQL behind PgBouncer in transaction mode: no prepared statements are cached (a
    statement prepared on one server connection is not there on the next)."""
    sqlite_busy_timeout_seconds: float = Field(default=5.0, ge=0)
    """How long a SQLite write waits for another process's write before it tries again (a write
    gives up after a minute of a locked database)."""
    job_write_timeout_seconds: float = Field(default=5.0, gt=0)
    """Longest a chat's answer waits for its Manager job to be written, a write the database
    fails (restarting, locked beyond patience, full) tried again meanwhile; its turn on a SQLite
    file another process writes is not counted, nor the making of a large body's turns. Beyond
    it the chat answers 503 with Retry-After and none of the answer, so that a client that got
    an answer has its job."""

    # --- memory: embeddings, recall and injection ------------------------------------------
    embedding_model: str = ""
    """Local folder of a sentence-transformers model; empty: the bundled all-MiniLM-L6-v2."""
    embedding_cache_dir: str = "./data/models"
    """Where the model's ONNX export is written once and reused."""
    embedding_quantize: Literal["queries", "all", "none"] = "queries"
    """Which texts the int8 export of the model embeds: search queries only (3x faster, same
    recall measured), memories too (2x faster imports, ~2 points of recall less), or none.
    Queries always run on a session of their own: with `none` or `all` a second one of the
    same export (measured: +157 MB resident with `none`, +53 MB with `all`)."""
    embedding_threads: int = Field(default=0, ge=0, le=64)
    """CPU threads a run embedding memories (imports, the Manager's writes) may use, at a lower
    priority than chats; 0: every core this process may use (its container's CPU limit
    counted), at most 8. A query always uses one."""
    relevance_threshold: float = Field(default=0.2, ge=0.0, le=1.0)
    """Least fused score (0-1, see app/memory/search/ranking.py) a memory needs to be injected.
    Measured on the LoCoMo dev conversations: 0.2 keeps 86 % of the memories that answer a question
    (0.3 keeps 61 %); clearly unrelated questions score ~0.1 against a store of personal facts."""
    dense_weight: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of the embedding similarity in the fused score; the rest is BM25's."""
    recall_limit: int = Field(default=8, ge=0, le=100)
    """Most memories injected into one chat request (0 turns injection off)."""
    memory_token_budget: int = Field(default=600, ge=0)
    """Most tokens (estimated at 4 characters each) the injected memories may take; the block's
    fixed one-sentence header (~45 tokens) comes on top."""
    episode_share: float = Field(default=0.4, ge=0, le=1)
    """The part of MEMPROXY_MEMORY_TOKEN_BUDGET the user's own words (episodes) may take; facts
    take the rest. What one kind leaves unused goes to the other; 0 shows episodes only in
    what facts leave."""
    profile_token_budget: int = Field(default=150, ge=0)
    """Most tokens the user's profile may take: their pinned memories and standing facts, shown in
    every chat whatever the question (past it: the most recalled, then the newest); 0 shows no
    profile. Comes on top of MEMPROXY_MEMORY_TOKEN_BUDGET."""
    recall_timeout_seconds: float = Field(default=2.0, gt=0)
    """Longest a chat waits for recall; past it the chat goes on without memories."""
    recall_judge: bool = False
    """Before a chat's memories are chosen, the Manager's model (MEMPROXY_MANAGER_MODEL, else the
    chat's own) picks which of the 8 best candidates help answer the message; on a timeout or
    an error the search's order stands. Adds a model call to each recalled chat's first byte."""
    recall_judge_seconds: float = Field(default=1.0, gt=0)
    """Longest the relevance judge may take; past it the search's order stands."""
    index_cache_max_memories: int = Field(default=300_000, ge=1)
    """Memories kept in the in-process search indexes (least recently used users evicted)."""
    index_idle_seconds: float = Field(default=1800.0, ge=0)
    """A user's search index not searched for this long is dropped and its memory given back to
    the system (rebuilt, or loaded from its image, at the user's next chat); 0: kept until
    MEMPROXY_INDEX_CACHE_MAX_MEMORIES evicts it."""
    index_image_min_memories: int = Field(default=10_000, ge=0)
    """Users with at least this many memories get an index image in the database (their search
    index, ~1 KB a memory and part): a restart or another replica loads it and catches up
    instead of reading and analysing every memory. 0: no images."""
    index_ivf_min_vectors: int = Field(default=50_000, ge=0)
    """A user's vector index of at least this many vectors (a memory has one per sentence, and
    one for the whole; at least 256) searches an approximate index (IVF: the nearest quarter of
    its lists) instead of every vector; trained in the background, kept in the index image.
    Measured among ~58,000 vectors of one conversation's people and topics: recall within 0.003
    of the exhaustive search (docs/performance.md). 0: always exhaustive."""
    memory_max_chars: int = Field(default=4000, ge=1)
    """Longest memory content accepted by the API."""

    # --- security and identity ----------------------------------------------------------------
    api_keys: CommaList = Field(default_factory=list)
    """Accepted client keys, comma-separated, each `key` or `key:user_id`. Empty: open server."""
    admin_keys: CommaList = Field(default_factory=list)
    """Operator keys for the memory API, where they may act for any user (`?user=`)."""
    require_user: bool = False
    """Answer 401 when no user can be resolved, instead of using the `anonymous` user."""
    user_id_headers: CommaList = Field(default_factory=lambda: ["X-OpenWebUI-User-Id", "X-User-Id"])
    """Headers naming the user, in order of precedence (Open WebUI's forwarded header first)."""
    user_name_headers: CommaList = Field(
        default_factory=lambda: ["X-OpenWebUI-User-Name", "X-User-Name"]
    )
    """Headers saying what the user is called (Open WebUI's, percent-encoded or not, first): a
    question naming the user is searched as the user asking about themselves. With
    MEMPROXY_OPENWEBUI_JWT_SECRET, the signed token's name is used instead. Empty: none."""
    task_header: str = "X-OpenWebUI-Task"
    """Header whose non-empty value marks an Open WebUI background task (title, tags...)."""
    openwebui_jwt_secret: SecretStr | None = None
    """Open WebUI's FORWARD_USER_INFO_HEADER_JWT_SECRET: the user then comes only from its signed
    X-OpenWebUI-User-Jwt; plain user headers are refused (401). Empty: unsigned headers."""
    openwebui_jwt_max_lifetime_seconds: int = Field(default=86400, ge=1)
    """Longest lifetime (exp - iat) a signed user token may have (401 beyond it): Open WebUI's
    live FORWARD_USER_INFO_HEADER_JWT_EXPIRES_SECONDS (300 by default)."""
    unbound_keys_name_users: bool = True
    """A key of MEMPROXY_API_KEYS bound to no user (`key`, not `key:user`) may name any user with
    the user headers or the body's `user` (how one Open WebUI key serves all its users). false:
    such a key is `anonymous` (401 with MEMPROXY_REQUIRE_USER) and a user header sent with it is
    refused (403). Open WebUI's signed token names users either way."""
    metrics_require_key: bool = True
    """With keys set (MEMPROXY_API_KEYS or MEMPROXY_ADMIN_KEYS), `/metrics` needs one of them as a
    bearer key, 401 otherwise (Prometheus: `authorization: {credentials: KEY}`); false: open."""
    docs_enabled: bool = True
    """Serve the API's description: `/openapi.json`, `/docs` and `/redoc` (false: 404)."""
    docs_require_key: bool = True
    """With keys set (MEMPROXY_API_KEYS or MEMPROXY_ADMIN_KEYS), the API's description needs one
    of them as a bearer key, 401 otherwise (a browser cannot send one to `/docs`: fetch
    `/openapi.json` with curl, or set false on a trusted network)."""
    allowed_hosts: CommaList = Field(default_factory=list)
    """Names an open server (no MEMPROXY_API_KEYS) answers to besides localhost, IP addresses
    and MEMPROXY_HOST, comma-separated (`memproxy` in the compose stack; `*`: any). Another
    name in `Host` is answered 421: a page on a name rebound to this address would read it."""

    @field_validator(
        "api_keys", "admin_keys", "user_id_headers", "user_name_headers", "allowed_hosts",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("api_keys")
    @classmethod
    def _normal_bound_users(cls, value: list[str]) -> list[str]:
        # The user a key is bound to is a user id as any other (app/proxy/user_ids.py): in NFC,
        # and one that could pass for another's stops the start, naming the key by position.
        entries = []
        for number, entry in enumerate(value, start=1):
            key, sep, user = entry.partition(":")
            try:
                entries.append(f"{key}{sep}{normal_user_id(user)}" if sep else entry)
            except UserIdRefused as exc:
                raise ValueError(f"the user of key {number} {exc}") from None
        return entries

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return value.upper()

    @field_validator("upstream_base_url", "manager_base_url")
    @classmethod
    def _strip_slash(cls, value: str, info: ValidationInfo) -> str:
        if info.field_name == "manager_base_url" and not value:  # empty: the upstream's
            return value
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("upstream_ca_file")
    @classmethod
    def _readable_ca_file(cls, value: str) -> str:
        # Checked here, so that a bad file stops the start with one line naming the setting.
        if value:
            try:
                ssl.create_default_context(cafile=value)
            except ssl.SSLError:  # an OSError too: caught first
                raise ValueError("expected a PEM file of CA certificates") from None
            except OSError as exc:
                raise ValueError(f"cannot read it ({exc.strerror or exc})") from None
        return value

    @property
    def parsed_api_keys(self) -> tuple[ApiKey, ...]:
        """`api_keys` split into key and bound user (at the first `:`)."""
        keys = []
        for entry in self.api_keys:
            key, sep, user = entry.partition(":")
            keys.append(ApiKey(key=key, user_id=(user.strip() or None) if sep else None))
        return tuple(keys)
