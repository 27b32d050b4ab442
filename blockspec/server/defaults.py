"""Default request limits, importable without the web stack: the CLI's argument parser reads
them, and `blockspec bench`/`generate` must start on machines without fastapi."""

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024  # 4 MiB: a full 128k-token context is well under 1 MiB of text
DEFAULT_BODY_TIMEOUT_S = 60.0
