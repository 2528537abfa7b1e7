"""Knobs of the host executor: environment variables of the LocalStack process, read once at import.

HOST_LAMBDA_ECHO (1)           also print every output line of a function into LocalStack's log,
                               as `[lambda <fn>:<env>] ...`
HOST_LAMBDA_LOG_DIR (empty)    also append every output line of a function to <dir>/<function>.log
HOST_LAMBDA_INHERIT_ENV (0)    1: functions inherit LocalStack's whole environment; 0: only PASS_ENV
HOST_LAMBDA_KILL_GRACE (2)     seconds between SIGTERM and SIGKILL when an environment is stopped
HOST_LAMBDA_ENDPOINT_HOST      host in the functions' AWS_ENDPOINT_URL (default: GATEWAY_LISTEN's
                               host, or 127.0.0.1 when that is 0.0.0.0)
HOST_LAMBDA_INIT_TIMEOUT (10)  seconds a new environment's runtime may take to initialise (Lambda's
                               fixed 10 s); a slower init is retried by the first invocation within
                               the function's Timeout, as on AWS. Capped below
                               LAMBDA_RUNTIME_ENVIRONMENT_TIMEOUT, whose timer would fail the invoke.
HOST_LAMBDA_CREDENTIALS_DIR    (empty) for tests that verify SigV4 signatures a function makes: each
                               environment's role credentials (LocalStack's, from its STS) are
                               written as <dir>/<access key id>, holding the secret key (0600), so a
                               verifying endpoint can recompute the signature
HOST_LAMBDA_PDEATHSIG (1)      start each bootstrap through `setpriv --pdeathsig KILL` (when setpriv
                               exists), so that it dies with LocalStack even after a SIGKILL

LocalStack's own settings apply as usual: LAMBDA_KEEPALIVE_MS (idle environments are stopped),
LAMBDA_RUNTIME_ENVIRONMENT_TIMEOUT (20 s: LocalStack's own bound on starting an environment),
LAMBDA_LIMITS_CONCURRENT_EXECUTIONS.
"""

from __future__ import annotations

import os


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value in ("1", "true", "yes", "on")


def _float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


ECHO: bool = _flag("HOST_LAMBDA_ECHO", True)
LOG_DIR: str = os.environ.get("HOST_LAMBDA_LOG_DIR", "").strip()
INHERIT_ENV: bool = _flag("HOST_LAMBDA_INHERIT_ENV", False)
KILL_GRACE_S: float = max(0.0, _float("HOST_LAMBDA_KILL_GRACE", 2.0))
ENDPOINT_HOST: str = os.environ.get("HOST_LAMBDA_ENDPOINT_HOST", "").strip()
PDEATHSIG: bool = _flag("HOST_LAMBDA_PDEATHSIG", True)
CREDENTIALS_DIR: str = os.environ.get("HOST_LAMBDA_CREDENTIALS_DIR", "").strip()
INIT_TIMEOUT_S: float = max(0.1, _float("HOST_LAMBDA_INIT_TIMEOUT", 10.0))

# What a function gets from LocalStack's own environment (besides what LocalStack builds for it:
# the function's variables, role credentials, region, AWS_LAMBDA_*, AWS_ENDPOINT_URL, TZ).
PASS_ENV: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR")

# Output kept per environment for LocalStack's get_logs() (it prints them on start-up errors).
MAX_HISTORY_CHARS: int = 256 * 1024
