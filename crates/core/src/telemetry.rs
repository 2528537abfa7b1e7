//! Structured logs with `tracing`: JSON inside Lambda (or with `SAS_LOG_FORMAT=json`), compact
//! text on a terminal. The filter comes from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

pub fn init() {
    init_with_default("info");
}

/// As [`init`], with another filter when `RUST_LOG` is not set (a tool whose own output says
/// what happened keeps the library's lines for errors: `"error"`).
pub fn init_with_default(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let json = std::env::var("AWS_LAMBDA_FUNCTION_NAME").is_ok()
        || std::env::var("SAS_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let result = if json {
        // CloudWatch adds its own timestamp. The current span's fields (role, task_id, step,
        // attempt: role::handle) go under "span"; not the list of every span (the same fields
        // again, billed by the byte).
        builder.json().flatten_event(true).with_current_span(true).with_span_list(false).without_time().try_init()
    } else {
        // Colours only on a terminal: CI logs and files get plain text.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        builder.compact().with_ansi(ansi).with_writer(std::io::stderr).try_init()
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}

/// The metrics recorder of this process, when [`init_metrics`] installed one.
static METRICS: std::sync::OnceLock<&'static metrics_cloudwatch_embedded::Collector> = std::sync::OnceLock::new();

/// Install the CloudWatch Embedded Metric Format recorder (namespace: `SAS_METRICS_NAMESPACE`,
/// default [`crate::metrics::DEFAULT_NAMESPACE`]; `SAS_METRICS=off` installs none). Metrics are
/// kept in memory until [`flush_metrics`]. A second call, or a process that has another recorder,
/// keeps the first.
pub fn init_metrics() {
    if std::env::var("SAS_METRICS").is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
        return;
    }
    let namespace =
        std::env::var("SAS_METRICS_NAMESPACE").unwrap_or_else(|_| crate::metrics::DEFAULT_NAMESPACE.to_owned());
    if METRICS.get().is_some() {
        return;
    }
    match metrics_cloudwatch_embedded::Builder::new().cloudwatch_namespace(namespace).init() {
        Ok(c) => {
            let _ = METRICS.set(c);
            crate::metrics::describe();
        }
        Err(e) => tracing::warn!(error = %e, "metrics recorder not installed; no metrics from this process"),
    }
}

/// Write the metrics recorded since the last flush as EMF records (one JSON line per dimension set
/// used) to stdout, where Lambda sends them to CloudWatch Logs, which turns them into metrics.
/// Nothing is written when nothing was recorded, or without a recorder.
pub fn flush_metrics() {
    flush_metrics_to(std::io::stdout().lock());
}

/// [`flush_metrics`] into `w`.
pub fn flush_metrics_to(w: impl std::io::Write) {
    if let Some(c) = METRICS.get() {
        if let Err(e) = c.flush(w) {
            tracing::warn!(error = %e, "metrics not written");
        }
    }
}
