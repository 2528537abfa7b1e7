"""LocalStack Lambda runtime executor `host`: `provided.*` functions run as host processes.

LocalStack 4.13.1 picks its Lambda runtime executor from the plux namespace
`localstack.lambda.runtime_executor` by the setting `LAMBDA_RUNTIME_EXECUTOR`. This package adds
the plugin `host` there (see `sas_lambda_executor-1.0.0.dist-info/entry_points.txt` beside it): put
the folder holding both on `PYTHONPATH` and set `LAMBDA_RUNTIME_EXECUTOR=host`;
`infra/localstack.sh` does both. Nothing is installed into LocalStack's venv and LocalStack needs no
patch.

Modules:
- `settings`: the knobs (environment variables `HOST_LAMBDA_*` of the LocalStack process).
- `runtime_api`: the Lambda Runtime API that a function's `bootstrap` talks to.
- `sandbox`: one `bootstrap` process with its Runtime API server and its output.
- `layers`: a function's layers merged into the directory that stands for /opt, and its variables
  that name paths under /opt pointed there.
- `platform_log`: the START/END/REPORT (or JSON `platform.*`) lines Lambda adds to a function's log.
- `executor`: `HostRuntimeExecutor` (LocalStack's `RuntimeExecutor`) and the plugin class.

Only `executor` imports LocalStack, so the other modules can be read and tested without it.
"""

__version__ = "1.0.0"
